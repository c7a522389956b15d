//! [`Notifier`]: takes notices without waiting, and sends and retries each
//! channel in a background task, within bounds.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};

use super::email::redact_keys;
use super::email::{self, EmailSettings};
use super::webhook::WebhookSettings;
use super::{Alert, AlertNotice, LeakNotice};
use crate::clock::{Clock, SystemClock};
use crate::telemetry;

/// The waits between attempts, by default: 1 s, 5 s, 30 s, 2 min, 10 min
/// (six attempts over about 13 minutes).
pub const DEFAULT_RETRY_WAITS: [Duration; 5] = [
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(120),
    Duration::from_secs(600),
];

/// The most attempts (e-mails and webhooks together) under way at once; the
/// others wait their turn.
pub const MAX_SENDS_IN_FLIGHT: usize = 4;

/// The most notices waiting for delivery or a retry, by default; past it a
/// notice is dropped (logged in full, counted as `dropped`).
pub const DEFAULT_MAX_PENDING_NOTICES: usize = 10_000;

/// The longest one attempt may take: connecting, each SMTP command, or the
/// webhook's answer.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends [`LeakNotice`]s by e-mail and webhook in the background. Cheap to
/// clone: clones share their channels, bounds and pending notices.
#[derive(Clone)]
pub struct Notifier {
    config: Arc<Config>,
    state: Arc<State>,
}

#[derive(Clone, Debug)]
struct Config {
    email: Option<EmailSettings>,
    webhook: Option<WebhookSettings>,
    retry_waits: Vec<Duration>,
    max_pending_notices: usize,
    /// The time each webhook attempt is signed with.
    clock: Arc<dyn Clock>,
}

struct State {
    /// Notices taken and not yet finished: `idle` waits for 0.
    pending: watch::Sender<usize>,
    sends: Semaphore,
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notifier")
            .field("email", &self.config.email)
            .field("webhook", &self.config.webhook)
            .field("retry_waits", &self.config.retry_waits)
            .field("max_pending_notices", &self.config.max_pending_notices)
            .field("clock", &self.config.clock)
            .field("pending", &*self.state.pending.borrow())
            .finish()
    }
}

impl Notifier {
    /// A notifier that sends nothing (each notice is logged at `info`):
    /// for tests, and for a gateway with no notice settings.
    pub fn disabled() -> Self {
        Notifier::new(None, None)
    }

    /// A notifier for the channels given (either, both or none), with
    /// [`DEFAULT_RETRY_WAITS`] and [`DEFAULT_MAX_PENDING_NOTICES`].
    pub fn new(email: Option<EmailSettings>, webhook: Option<WebhookSettings>) -> Self {
        Notifier {
            config: Arc::new(Config {
                email,
                webhook,
                retry_waits: DEFAULT_RETRY_WAITS.to_vec(),
                max_pending_notices: DEFAULT_MAX_PENDING_NOTICES,
                clock: Arc::new(SystemClock),
            }),
            state: Arc::new(State {
                pending: watch::Sender::new(0),
                sends: Semaphore::new(MAX_SENDS_IN_FLIGHT),
            }),
        }
    }

    /// The waits between a channel's attempts: one attempt, then one more
    /// after each wait. Empty: a single attempt.
    pub fn with_retry_waits(mut self, waits: Vec<Duration>) -> Self {
        Arc::make_mut(&mut self.config).retry_waits = waits;
        self
    }

    /// The most notices waiting for delivery or a retry at once (at least
    /// 1).
    pub fn with_max_pending_notices(mut self, notices: usize) -> Self {
        Arc::make_mut(&mut self.config).max_pending_notices = notices.max(1);
        self
    }

    /// The clock each webhook attempt's timestamp is read from; the system
    /// clock by default (receivers check the timestamp against theirs).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        Arc::make_mut(&mut self.config).clock = clock;
        self
    }

    /// Tells the key's owner and the operator about a leaked key, in a task
    /// on the current tokio runtime; returns at once and never panics.
    ///
    /// Must be called within a tokio runtime: without one the notice is
    /// dropped (logged at `error` in full, counted as `dropped`), as it is
    /// when [`with_max_pending_notices`](Self::with_max_pending_notices)
    /// notices are already waiting.
    pub fn leak_detected(&self, notice: LeakNotice) {
        self.take(Notice::Leak(notice));
    }

    /// Tells the account's owner (by e-mail) and the webhook about an
    /// alert, as [`leak_detected`](Self::leak_detected) does a leak: in the
    /// background, with the same retries, bounds and metric. The webhook's
    /// `type` is [`AlertNotice::event_type`], its `id` the notice's `id`.
    pub fn alert(&self, notice: AlertNotice) {
        self.take(Notice::Alert(notice));
    }

    fn take(&self, notice: Notice) {
        let channels = self.channels(&notice);
        if self.config.email.is_none() && self.config.webhook.is_none() {
            tracing::info!(
                account = %notice.account(),
                key = notice.logged_key(),
                notice = notice.kind(),
                "no notice sent, none is configured"
            );
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            drop_notice(&notice, &channels, "no tokio runtime to send it on");
            return;
        };
        let Some(pending) = Pending::take(&self.state, self.config.max_pending_notices) else {
            drop_notice(&notice, &channels, "too many notices are waiting already");
            return;
        };
        let notifier = self.clone();
        runtime.spawn(async move {
            // Released even if the task is dropped with its runtime.
            let _pending = pending;
            notifier.deliver(notice).await;
        });
    }

    /// Resolves once no notice is being sent or waiting for a retry.
    pub async fn idle(&self) {
        let mut pending = self.state.pending.subscribe();
        // The sender lives in `self`, so the channel cannot close while
        // waiting.
        let _ = pending.wait_for(|count| *count == 0).await;
    }

    /// The channels `notice` would go out on.
    fn channels(&self, notice: &Notice) -> Vec<Channel> {
        let mut channels = Vec::with_capacity(2);
        if self.config.email.is_some() && notice.email().is_some() {
            channels.push(Channel::Email);
        }
        if self.config.webhook.is_some() {
            channels.push(Channel::Webhook);
        }
        channels
    }

    async fn deliver(&self, notice: Notice) {
        let email = async {
            if let Some(settings) = &self.config.email {
                self.deliver_email(settings, &notice).await;
            }
        };
        let webhook = async {
            if let Some(settings) = &self.config.webhook {
                self.deliver_webhook(settings, &notice).await;
            }
        };
        futures_util::future::join(email, webhook).await;
    }

    async fn deliver_email(&self, settings: &EmailSettings, notice: &Notice) {
        let Some(address) = notice.email() else {
            tracing::info!(
                account = %notice.account(),
                key = notice.logged_key(),
                notice = notice.kind(),
                "the account has no e-mail address, so no e-mail is sent"
            );
            return;
        };
        let message = email::recipient(address).and_then(|to| match notice {
            Notice::Leak(leak) => settings.compose(leak, to),
            Notice::Alert(alert) => settings.compose_alert(alert, to),
        });
        let message = match message {
            Ok(message) => message,
            Err(reason) => {
                // Retrying would build the same message: nothing to wait for.
                tracing::warn!(
                    channel = Channel::Email.name(),
                    account = %notice.account(),
                    key = notice.logged_key(),
                    notice = notice.kind(),
                    email = ?address,
                    error = %reason,
                    "notice e-mail not sent"
                );
                telemetry::notice_outcome(Channel::Email.name(), "failed");
                return;
            }
        };
        self.with_retries(Channel::Email, notice, || settings.send(message.clone()))
            .await;
    }

    async fn deliver_webhook(&self, settings: &WebhookSettings, notice: &Notice) {
        // A key pasted into a key's name is redacted as in the e-mail: the
        // webhook's receiver is no more trusted with it.
        let body = match notice {
            Notice::Leak(leak) => {
                let leak = LeakNotice {
                    key_name: redact_keys(&leak.key_name),
                    ..leak.clone()
                };
                WebhookSettings::payload(&leak, &hex::encode(crate::random::bytes::<16>()))
            }
            // The crossing's own id: every instance and attempt sends the same.
            Notice::Alert(alert) => {
                let mut alert = alert.clone();
                if let Alert::KeyLimitPercent { key_name, .. } = &mut alert.alert {
                    *key_name = redact_keys(key_name);
                }
                WebhookSettings::event(alert.event_type(), &alert.id, &alert)
            }
        };
        let body = match body {
            Ok(body) => body,
            Err(reason) => {
                give_up(Channel::Webhook, notice, 0, &reason);
                return;
            }
        };
        let clock = &self.config.clock;
        self.with_retries(Channel::Webhook, notice, || {
            settings.post(body.clone(), clock.now())
        })
        .await;
    }

    /// Runs `attempt` until it succeeds, fails permanently, or the retry
    /// waits run out. Each attempt holds one of the
    /// [`MAX_SENDS_IN_FLIGHT`] places; the waits between hold none.
    async fn with_retries<F, Fut>(&self, channel: Channel, notice: &Notice, mut attempt: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), Failure>>,
    {
        let mut waits = self.config.retry_waits.iter();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let outcome = {
                // The semaphore is never closed, so this always yields a place.
                let _place = self.state.sends.acquire().await.ok();
                match tokio::time::timeout(ATTEMPT_TIMEOUT, attempt()).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err(Failure::transient(format!(
                        "no answer within {} s",
                        ATTEMPT_TIMEOUT.as_secs()
                    ))),
                }
            };
            let failure = match outcome {
                Ok(()) => {
                    tracing::info!(
                        channel = channel.name(),
                        account = %notice.account(),
                        key = notice.logged_key(),
                        notice = notice.kind(),
                        attempts,
                        "{} sent",
                        notice.kind()
                    );
                    telemetry::notice_outcome(channel.name(), "sent");
                    return;
                }
                Err(failure) => failure,
            };
            let wait = if failure.permanent {
                None
            } else {
                waits.next()
            };
            let Some(wait) = wait else {
                give_up(channel, notice, attempts, &failure.reason);
                return;
            };
            tracing::warn!(
                channel = channel.name(),
                account = %notice.account(),
                key = notice.logged_key(),
                notice = notice.kind(),
                attempt = attempts,
                retry_in_ms = wait.as_millis() as u64,
                error = %failure.reason,
                "{} not delivered; will retry",
                notice.kind()
            );
            telemetry::notice_outcome(channel.name(), "retried");
            tokio::time::sleep(*wait).await;
        }
    }
}

/// What a notifier carries: a leak notice or an alert, each sent on the
/// same channels with the same retries and bounds.
#[derive(Clone, Debug)]
enum Notice {
    Leak(LeakNotice),
    Alert(AlertNotice),
}

impl Notice {
    fn account(&self) -> &str {
        match self {
            Notice::Leak(leak) => &leak.account,
            Notice::Alert(alert) => &alert.account,
        }
    }

    fn email(&self) -> Option<&str> {
        match self {
            Notice::Leak(leak) => leak.email.as_deref(),
            Notice::Alert(alert) => alert.email.as_deref(),
        }
    }

    /// Its name in logs: `leak notice` or the alert's event type.
    fn kind(&self) -> &'static str {
        match self {
            Notice::Leak(_) => "leak notice",
            Notice::Alert(alert) => alert.event_type(),
        }
    }

    /// The key as logs name it: as the access log does, by the first 8 hex
    /// digits of its hash (the notice carries 12), so the lines of one key
    /// can be found together; empty for an account's alert.
    fn logged_key(&self) -> &str {
        let prefix = match self {
            Notice::Leak(leak) => leak.key_hash_prefix.as_str(),
            Notice::Alert(alert) => alert.key_hash_prefix(),
        };
        prefix
            .char_indices()
            .nth(8)
            .map_or(prefix, |(end, _)| &prefix[..end])
    }
}

/// One of a notice's channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Channel {
    Email,
    Webhook,
}

impl Channel {
    /// Its name in logs and the metric's `channel` label.
    fn name(self) -> &'static str {
        match self {
            Channel::Email => "email",
            Channel::Webhook => "webhook",
        }
    }
}

/// Why an attempt failed, and whether trying again could help.
#[derive(Debug)]
pub(super) struct Failure {
    reason: String,
    permanent: bool,
}

impl Failure {
    /// A failure worth retrying: no connection, no answer, a 4xx from
    /// SMTP, any non-2xx from the webhook.
    pub(super) fn transient(reason: impl Into<String>) -> Self {
        Failure {
            reason: reason.into(),
            permanent: false,
        }
    }

    /// A failure the same attempt would meet again (an SMTP 5xx).
    pub(super) fn permanent(reason: impl Into<String>) -> Self {
        Failure {
            reason: reason.into(),
            permanent: true,
        }
    }
}

/// `error` and its sources, joined by `: ` (hyper's and lettre's top-level
/// messages alone rarely say what happened).
pub(super) fn error_chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A place among the pending notices, given back when dropped.
struct Pending(Arc<State>);

impl Pending {
    /// A place, unless `max` notices are pending already.
    fn take(state: &Arc<State>, max: usize) -> Option<Self> {
        let taken = state.pending.send_if_modified(|count| {
            if *count < max {
                *count += 1;
                true
            } else {
                false
            }
        });
        taken.then(|| Pending(Arc::clone(state)))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0
            .pending
            .send_modify(|count| *count = count.saturating_sub(1));
    }
}

/// Logs, with everything needed to tell the owner by hand, a notice that
/// will not be delivered on `channel`, and counts it as `failed`.
fn give_up(channel: Channel, notice: &Notice, attempts: u32, reason: &str) {
    log_undelivered(notice, Some(channel), Some(attempts), reason, "failed");
    telemetry::notice_outcome(channel.name(), "failed");
}

/// Logs in full, and counts as `dropped` on each of `channels`, a notice
/// that was not even queued.
fn drop_notice(notice: &Notice, channels: &[Channel], reason: &str) {
    log_undelivered(notice, None, None, reason, "dropped");
    for channel in channels {
        telemetry::notice_outcome(channel.name(), "dropped");
    }
}

/// One error line with every field of `notice` but the key itself.
fn log_undelivered(
    notice: &Notice,
    channel: Option<Channel>,
    attempts: Option<u32>,
    reason: &str,
    outcome: &'static str,
) {
    let key = notice.logged_key();
    match notice {
        Notice::Leak(notice) => tracing::error!(
            channel = channel.map(Channel::name),
            attempts,
            outcome,
            error = %reason,
            account = %notice.account,
            email = ?notice.email,
            key_name = ?notice.key_name,
            key,
            token_type = ?notice.token_type,
            url = ?notice.url,
            source = ?notice.source,
            reported_at = %notice.reported_at.to_rfc3339(),
            reported_by = %notice.reported_by,
            "leak notice NOT delivered: tell the account's owner by hand"
        ),
        // The notice names a key by its hash prefix only.
        Notice::Alert(alert) => tracing::error!(
            channel = channel.map(Channel::name),
            attempts,
            outcome,
            error = %reason,
            account = %alert.account,
            email = ?alert.email,
            id = %alert.id,
            alert = ?alert.alert,
            detected_at = %alert.detected_at.to_rfc3339(),
            "{} alert NOT delivered",
            alert.event_type()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::email::tests::notice;

    #[test]
    fn without_a_runtime_a_notice_is_dropped_not_panicked_over() {
        let webhook = WebhookSettings::new(
            "http://127.0.0.1:9/hook",
            crate::secrets::Secret::new("webhook-secret-0123456789".into()),
        )
        .unwrap();
        let notifier = Notifier::new(None, Some(webhook));
        notifier.leak_detected(notice());
        assert_eq!(*notifier.state.pending.borrow(), 0);
    }

    #[tokio::test]
    async fn a_disabled_notifier_is_idle_at_once() {
        let notifier = Notifier::disabled().with_retry_waits(vec![Duration::from_millis(1)]);
        notifier.leak_detected(notice());
        tokio::time::timeout(Duration::from_secs(1), notifier.idle())
            .await
            .unwrap();
    }

    #[test]
    fn pending_places_are_bounded_and_given_back() {
        let notifier = Notifier::disabled().with_max_pending_notices(2);
        let first = Pending::take(&notifier.state, 2).unwrap();
        let second = Pending::take(&notifier.state, 2).unwrap();
        assert!(Pending::take(&notifier.state, 2).is_none());
        drop(first);
        let third = Pending::take(&notifier.state, 2).unwrap();
        drop((second, third));
        assert_eq!(*notifier.state.pending.borrow(), 0);
    }

    #[test]
    fn settings_apply_to_one_notifier_not_its_earlier_clones() {
        let notifier = Notifier::disabled();
        let clone = notifier.clone();
        let changed = notifier.with_retry_waits(Vec::new());
        assert!(changed.config.retry_waits.is_empty());
        assert_eq!(clone.config.retry_waits, DEFAULT_RETRY_WAITS.to_vec());
        // The pending notices are still shared.
        assert!(Arc::ptr_eq(&clone.state, &changed.state));
    }

    #[test]
    fn error_chains_name_each_cause_once() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("client error")
            }
        }
        impl Error for Outer {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        let error = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert_eq!(error_chain(&error), "client error: refused");
    }
}
