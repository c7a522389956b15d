//! The e-mail channel: the SMTP settings, the message a key's owner gets,
//! and one attempt to send it.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use lettre::message::Mailbox;
use lettre::message::header::ContentType;
use lettre::{Address, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::notifier::{ATTEMPT_TIMEOUT, Failure};
use super::{AlertNotice, LeakNotice, NotifyConfigError};

/// Where notice e-mails go out and whom they come from. `Debug` shows the
/// server without its password.
#[derive(Clone)]
pub struct EmailSettings {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    /// The SMTP URL without its password, for `Debug`.
    server: String,
    settings_page: String,
}

impl fmt::Debug for EmailSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmailSettings")
            .field("server", &self.server)
            .field("from", &self.from.to_string())
            .field("settings_page", &self.settings_page)
            .finish()
    }
}

impl EmailSettings {
    /// Settings for the SMTP server at `smtp_url`, sending as `from` (a
    /// mailbox such as `modelgate <keys@example.com>`).
    ///
    /// `smtp_url` is what lettre's `AsyncSmtpTransport::from_url` reads:
    /// `smtps://user:pass@host[:port]` (TLS from the start, port 465 by
    /// default), `smtp://user:pass@host[:port]?tls=required` (STARTTLS, 587),
    /// or `smtp://host[:port]` (plain, 25), meant for a relay on this
    /// machine. User and password are percent-encoded. A password is
    /// refused on a connection that may stay unencrypted (plain, or
    /// `?tls=opportunistic`) unless the host is a loopback one; plain SMTP
    /// to another host is allowed but logged at `warn`. Each command has
    /// [`ATTEMPT_TIMEOUT`] to be answered.
    pub fn new(smtp_url: &str, from: &str) -> Result<Self, NotifyConfigError> {
        let url = url::Url::parse(smtp_url)
            .map_err(|error| NotifyConfigError::new("smtp_url", format!("not a URL: {error}")))?;
        let tls = url
            .query_pairs()
            .find(|(name, _)| name == "tls")
            .map(|(_, value)| value.into_owned());
        let encrypted = match (url.scheme(), tls.as_deref()) {
            ("smtps", _) | ("smtp", Some("required")) => true,
            ("smtp", None | Some("opportunistic")) => false,
            (scheme, tls) => {
                return Err(NotifyConfigError::new(
                    "smtp_url",
                    format!(
                        "scheme {scheme:?} with tls={tls:?} is not one of smtps://host, \
                         smtp://host?tls=required or smtp://host (plain, a relay on this machine)"
                    ),
                ));
            }
        };
        let Some(host) = url.host_str().filter(|host| !host.is_empty()) else {
            return Err(NotifyConfigError::new("smtp_url", "names no host"));
        };
        let loopback = is_loopback(host);
        let credentials = !url.username().is_empty() || url.password().is_some();
        let server = format!(
            "{}://{}{}{}{}",
            url.scheme(),
            if url.username().is_empty() {
                String::new()
            } else {
                format!("{}@", url.username())
            },
            host,
            url.port()
                .map(|port| format!(":{port}"))
                .unwrap_or_default(),
            tls.as_deref()
                .map(|tls| format!("?tls={tls}"))
                .unwrap_or_default(),
        );
        if credentials && !encrypted && !loopback {
            return Err(NotifyConfigError::new(
                "smtp_url",
                format!(
                    "{server} would send its password unencrypted to another machine; \
                     use smtps:// or ?tls=required"
                ),
            ));
        }
        if !encrypted && !loopback {
            tracing::warn!(
                server = %server,
                "leak e-mails go to an SMTP server on another machine without TLS"
            );
        }
        // lettre's own errors name the scheme or the TLS setup, never the URL.
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(smtp_url)
            .map_err(|error| NotifyConfigError::new("smtp_url", format!("refused: {error}")))?
            .timeout(Some(ATTEMPT_TIMEOUT))
            .build();
        let from = Self::check_sender(from)?;
        Ok(EmailSettings {
            transport,
            from,
            server,
            settings_page: "/settings".to_owned(),
        })
    }

    /// Refuses a sender [`new`](Self::new) would refuse, before the SMTP
    /// URL is read.
    pub fn check_sender(from: &str) -> Result<Mailbox, NotifyConfigError> {
        Mailbox::from_str(from).map_err(|error| {
            NotifyConfigError::new(
                "from",
                format!(
                    "{from:?} is not a mailbox such as `modelgate <keys@example.com>`: {error}"
                ),
            )
        })
    }

    /// The key settings page the e-mail sends the owner to, as a full URL
    /// (`https://gateway.example.com/settings`); `/settings` by default.
    pub fn with_settings_page(mut self, url: &str) -> Self {
        self.settings_page = clean(url, 500);
        self
    }

    /// The message for `notice`, to `to`.
    pub(super) fn compose(&self, notice: &LeakNotice, to: Mailbox) -> Result<Message, String> {
        self.compose_text(subject(notice), body(notice, &self.settings_page), to)
    }

    /// The message for an alert, to `to`.
    pub(super) fn compose_alert(
        &self,
        notice: &AlertNotice,
        to: Mailbox,
    ) -> Result<Message, String> {
        self.compose_text(
            super::alert::subject(notice),
            super::alert::body(notice, &self.settings_page),
            to,
        )
    }

    fn compose_text(&self, subject: String, body: String, to: Mailbox) -> Result<Message, String> {
        // lettre adds no Message-ID of its own; some filters frown on mail
        // without one.
        let message_id = format!(
            "<{}@{}>",
            hex::encode(crate::random::bytes::<16>()),
            self.from.email.domain()
        );
        Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(subject)
            .message_id(Some(message_id))
            .header(ContentType::TEXT_PLAIN)
            .body(body)
            .map_err(|error| format!("the message cannot be built: {error}"))
    }

    /// One attempt to send `message`.
    pub(super) async fn send(&self, message: Message) -> Result<(), Failure> {
        match self.transport.send(message).await {
            Ok(_) => Ok(()),
            Err(error) => {
                let permanent = error.is_permanent();
                let reason = super::notifier::error_chain(&error);
                Err(if permanent {
                    Failure::permanent(reason)
                } else {
                    Failure::transient(reason)
                })
            }
        }
    }
}

/// The owner's mailbox, from a bare address (`owner@example.com`); a
/// display name is not taken, so nothing in it can reach a header.
pub(super) fn recipient(address: &str) -> Result<Mailbox, String> {
    Address::from_str(address.trim())
        .map(|address| Mailbox::new(None, address))
        .map_err(|error| format!("not an e-mail address: {error}"))
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

/// The subject line: the key's name, cleaned of anything that could break
/// a header (lettre encodes the rest).
pub(super) fn subject(notice: &LeakNotice) -> String {
    format!(
        "Your modelgate API key \"{}\" was found leaked",
        clean(&notice.key_name, 100)
    )
}

/// The message text. Every value from the notice is cleaned (no control
/// characters, bounded length, anything shaped like a key redacted), so
/// nothing in a key's name can forge a line of its own.
pub(super) fn body(notice: &LeakNotice, settings_page: &str) -> String {
    let name = clean(&notice.key_name, 200);
    let prefix = hash_prefix(&notice.key_hash_prefix);
    let account = clean(&notice.account, 200);
    let place = notice
        .url
        .as_deref()
        .map(|url| clean(url, 900))
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| "not given".to_owned());
    let source = notice
        .source
        .as_deref()
        .map(|source| clean(source, 100))
        .filter(|source| !source.is_empty())
        .unwrap_or_else(|| "not given".to_owned());
    let reporter = match notice.reported_by.as_str() {
        "secret_scanning" => "GitHub secret scanning".to_owned(),
        "operator" => "the operator of this modelgate gateway".to_owned(),
        other => clean(other, 100),
    };
    let when = notice.reported_at.format("%Y-%m-%d %H:%M:%S UTC");
    format!(
        "Hello,

Your modelgate API key \"{name}\" (hash prefix {prefix}) of account
{account} was found where others can read it, so it has been disabled.

  Key:          \"{name}\", hash prefix {prefix}
  Account:      {account}
  Found at:     {place}
  Found in:     {source}
  Reported at:  {when}
  Reported by:  {reporter}

The key is disabled: modelgate refuses every request made with it from now
on. Whoever found it cannot use it, and neither can your own programs that
still send it.

What to do now:

1. Open the key settings page ({settings_page}), delete the leaked key and
   create a new one.
2. Give the new key to your programs in an environment variable (or a
   secret manager). Never put a key in a repository, not even a private
   one, and never in code that runs in a browser.
3. Check your account's usage for requests you did not make.

This message does not contain the key itself: the hash prefix only tells
you which of your keys it was.

-- 
modelgate
"
    )
}

/// At most 12 hex digits of the hash prefix; anything else is not shown,
/// in case a caller passed something that is not a hash.
fn hash_prefix(prefix: &str) -> String {
    let prefix: String = prefix.chars().take(12).collect();
    if !prefix.is_empty() && prefix.chars().all(|c| c.is_ascii_hexdigit()) {
        prefix.to_ascii_lowercase()
    } else {
        "(not given)".to_owned()
    }
}

/// `text` on one line: control and bidirectional-override characters
/// become spaces (no forged lines, no reordered text), at most
/// `max_chars` characters are kept, and anything shaped like a modelgate
/// key is redacted.
pub(super) fn clean(text: &str, max_chars: usize) -> String {
    let mut chars = text.trim().chars().map(|c| {
        let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi {
            ' '
        } else {
            c
        }
    });
    let kept: String = chars.by_ref().take(max_chars).collect();
    let cut = chars.next().is_some();
    let mut cleaned = redact_keys(kept.trim());
    if cut {
        cleaned.push_str("...");
    }
    cleaned
}

/// The text with the characters after each `mg-v1-` (any case) replaced:
/// a notice names a key by its name and hash, so a key pasted into a name
/// must not travel on by e-mail.
pub(super) fn redact_keys(text: &str) -> String {
    const KEY_PREFIX: &str = "mg-v1-";
    // ASCII lower-casing keeps every byte offset.
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(found) = lower[at..].find(KEY_PREFIX) {
        let start = at + found;
        out.push_str(&text[at..start]);
        out.push_str("[redacted key]");
        let after = start + KEY_PREFIX.len();
        at = after
            + text[after..]
                .find(|c: char| !c.is_ascii_alphanumeric())
                .unwrap_or(text.len() - after);
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chrono::TimeZone;

    pub(crate) fn notice() -> LeakNotice {
        LeakNotice {
            account: "acct_7".into(),
            email: Some("owner@example.com".into()),
            key_name: "ci deploys".into(),
            key_hash_prefix: "3f9a0c1b2d4e".into(),
            token_type: "modelgate_api_key".into(),
            url: Some("https://github.com/octo/app/blob/main/.env".into()),
            source: Some("content".into()),
            reported_at: chrono::Utc.with_ymd_and_hms(2025, 3, 1, 12, 30, 5).unwrap(),
            reported_by: "secret_scanning".into(),
        }
    }

    fn settings() -> EmailSettings {
        EmailSettings::new("smtp://127.0.0.1:2525", "modelgate <keys@example.com>").unwrap()
    }

    fn formatted(notice: &LeakNotice) -> String {
        let message = settings()
            .compose(notice, recipient("owner@example.com").unwrap())
            .unwrap();
        String::from_utf8(message.formatted()).unwrap()
    }

    #[test]
    fn the_message_names_everything_and_says_what_to_do() {
        let text = formatted(&notice());
        let (headers, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            headers.contains("Subject: Your modelgate API key \"ci deploys\" was found leaked"),
            "{headers}"
        );
        assert!(
            headers.contains("From: modelgate <keys@example.com>"),
            "{headers}"
        );
        assert!(headers.contains("To: owner@example.com"), "{headers}");
        assert!(
            headers.contains("Content-Type: text/plain; charset=utf-8"),
            "{headers}"
        );
        assert!(headers.contains("Message-ID: <"), "{headers}");
        for words in [
            "\"ci deploys\"",
            "hash prefix 3f9a0c1b2d4e",
            "acct_7",
            "https://github.com/octo/app/blob/main/.env",
            "Found in:     content",
            "2025-03-01 12:30:05 UTC",
            "GitHub secret scanning",
            "disabled",
            "refuses every request",
            "key settings page (/settings)",
            "delete the leaked key",
            "create a new one",
            "environment variable",
            "Never put a key in a repository",
            "browser",
        ] {
            assert!(body.contains(words), "{words:?} missing from\n{body}");
        }
        assert!(!text.contains("mg-v1-"), "{text}");
        // Plain ASCII with short lines: sent as it is, no transfer encoding
        // for a reader to undo.
        assert!(
            headers.contains("Content-Transfer-Encoding: 7bit"),
            "{headers}"
        );
    }

    #[test]
    fn missing_and_odd_values_are_named_as_such() {
        let mut odd = notice();
        odd.url = None;
        odd.source = Some("  ".into());
        odd.reported_by = "operator".into();
        odd.key_hash_prefix = "not hex at all".into();
        let text = body(&odd, "https://gw.example.com/settings");
        assert!(text.contains("Found at:     not given"), "{text}");
        assert!(text.contains("Found in:     not given"), "{text}");
        assert!(
            text.contains("the operator of this modelgate gateway"),
            "{text}"
        );
        assert!(text.contains("hash prefix (not given)"), "{text}");
        assert!(text.contains("(https://gw.example.com/settings)"), "{text}");
        // A full hash is cut to its prefix.
        odd.key_hash_prefix = "ABCDEF0123456789ABCDEF".into();
        assert!(body(&odd, "/settings").contains("(hash prefix abcdef012345)"));
    }

    #[test]
    fn a_key_name_with_cr_lf_injects_no_header_and_no_line() {
        let mut evil = notice();
        evil.key_name = "x\r\nBcc: victim@example.com\r\n\r\nYour key is fine".into();
        evil.url = Some("https://github.com/a\nReported by: nobody".into());
        let text = formatted(&evil);
        let (headers, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            !headers
                .lines()
                .any(|line| line.to_ascii_lowercase().starts_with("bcc:")),
            "{headers}"
        );
        assert!(
            !body
                .lines()
                .any(|line| line.starts_with("Your key is fine")),
            "{body}"
        );
        assert!(
            !body
                .lines()
                .any(|line| line.starts_with("Reported by: nobody")),
            "{body}"
        );
        assert_eq!(headers.matches("\r\nTo: ").count(), 1, "{headers}");
        // The envelope has the one recipient.
        let message = settings()
            .compose(&evil, recipient("owner@example.com").unwrap())
            .unwrap();
        assert_eq!(message.envelope().to().len(), 1);
    }

    #[test]
    fn a_key_pasted_into_a_field_is_redacted() {
        let mut pasted = notice();
        pasted.key_name = "oops mg-v1-AbCdEf0123456789xyz pasted".into();
        pasted.url = Some("https://github.com/o/r?q=MG-V1-abc".into());
        let text = body(&pasted, "/settings");
        assert!(!text.to_ascii_lowercase().contains("mg-v1-"), "{text}");
        assert!(text.contains("oops [redacted key] pasted"), "{text}");
        assert!(subject(&pasted).contains("[redacted key]"));
    }

    #[test]
    fn long_values_are_cut() {
        let mut long = notice();
        long.key_name = "n".repeat(5000);
        let text = body(&long, "/settings");
        assert!(text.lines().all(|line| line.len() < 998));
        assert!(subject(&long).len() < 200);
    }

    #[test]
    fn recipients_are_bare_addresses() {
        assert!(recipient("owner@example.com").is_ok());
        assert!(recipient(" owner@example.com ").is_ok());
        for bad in [
            "",
            "owner",
            "Owner <owner@example.com>",
            "owner@example.com\r\nBcc: x@example.com",
            "a@b@c",
        ] {
            assert!(recipient(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn smtp_urls_are_checked_and_never_printed_with_their_password() {
        let from = "modelgate <keys@example.com>";
        for good in [
            "smtp://127.0.0.1:2525",
            "smtp://localhost",
            "smtp://[::1]:25",
            "smtp://user:secret-pass@127.0.0.1:2525",
            "smtp://relay.internal:25",
            "smtp://user:secret-pass@smtp.example.com?tls=required",
            "smtps://user:secret-pass@smtp.example.com",
            "smtps://user:secret-pass@smtp.example.com:2465",
        ] {
            let settings =
                EmailSettings::new(good, from).unwrap_or_else(|error| panic!("{good}: {error}"));
            let shown = format!("{settings:?}");
            assert!(!shown.contains("secret-pass"), "{shown}");
            assert!(shown.contains("keys@example.com"), "{shown}");
        }
        for (bad, words) in [
            ("not a url", "not a URL"),
            ("http://smtp.example.com", "is not one of"),
            ("smtp://smtp.example.com?tls=sometimes", "is not one of"),
            (
                "smtp://user:secret-pass@smtp.example.com",
                "password unencrypted",
            ),
            (
                "smtp://user:secret-pass@smtp.example.com?tls=opportunistic",
                "password unencrypted",
            ),
            ("smtp:///nohost", "names no host"),
        ] {
            let error = EmailSettings::new(bad, from).unwrap_err();
            assert_eq!(error.setting(), "smtp_url");
            let text = error.to_string();
            assert!(text.contains(words), "{bad}: {text}");
            assert!(!text.contains("secret-pass"), "{text}");
        }
        for bad_from in ["", "no address", "a@b\r\nBcc: c@d"] {
            let error = EmailSettings::new("smtp://127.0.0.1:25", bad_from).unwrap_err();
            assert_eq!(error.setting(), "from", "{bad_from:?}");
        }
    }
}
