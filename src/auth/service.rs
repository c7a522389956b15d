use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use http::{HeaderMap, Request, Response};
use tokio::sync::Semaphore;
use tower_service::Service;

use super::checked::CheckedKeys;
use super::imported::{ImportedKeys, NotAKey, Presented, classify_checked};
use super::words::AuthWords;
use super::{ApiKey, AuthFailures, HeaderError, KeyHash, Principal, X_API_KEY, presented_key};
use crate::client_addr::ClientAddr;
use crate::context::RequestContext;
use crate::error::{ErrorKind, GatewayError};
use crate::keys::{KeyDirectory, KeyState};
use crate::limiter::{Additions, Admission, AdmissionFuture, Decision};
use crate::response_body::ResponseBody;
use crate::routing::{MessagesCall, is_api_path, is_model_call, messages_call};
use crate::store::FailurePolicy;

/// This layer's name in metrics and logs.
const LAYER: &str = "BearerAuth";

/// Admits a request only with `Authorization: Bearer <key>` naming a live
/// modelgate key, and puts its [`Principal`] into the request's
/// [`RequestContext`] (`principal`).
///
/// Every refusal is a 401 with its own message (missing header, wrong
/// scheme, malformed value, unknown, deleted, expired or disabled key) and
/// `WWW-Authenticate: Bearer`. A management key gets 403 anywhere but the
/// routes of the JSON API (`KeyRoutes`); a store that cannot
/// answer gives 503 (auth always fails closed). An admitted request goes on
/// without its `Authorization` header, so the gateway key can never reach
/// an upstream or a log of forwarded headers. See the [module docs](super)
/// for an example.
#[derive(Clone, Debug)]
pub struct BearerAuth<S> {
    pub(crate) inner: S,
    pub(crate) directory: KeyDirectory,
    pub(crate) failures: Option<AuthFailures>,
    pub(crate) lookups: Option<LookupBound>,
    pub(crate) words: Arc<AuthWords>,
    pub(crate) imported: Arc<[ImportedKeys]>,
    /// Keys whose checksum passed here before: one SHA-256 a request.
    pub(crate) checked: Arc<CheckedKeys>,
}

/// The bound on store reads made at once for keys not found live.
#[derive(Clone, Debug)]
pub(crate) struct LookupBound {
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) max_concurrent: usize,
}

impl LookupBound {
    /// The 503 of a lookup past the bound.
    fn refusal(&self) -> GatewayError {
        crate::telemetry::request_shed();
        GatewayError::new(
            ErrorKind::ServiceUnavailable,
            format!(
                "the gateway is overloaded: {} keys it does not know are already being looked up; retry in a moment",
                self.max_concurrent
            ),
        )
        .with_metadata("reason", "overloaded")
        .with_retry_after(Duration::from_secs(1))
    }
}

/// [`BearerAuth`]'s response future: the key lookup, then the inner
/// service (the deciding layers' future, deciding a [`Principal`]).
pub type ResponseFuture<S, B> = AdmissionFuture<S, B, Authenticated>;

impl<S, B, ResBody> Service<Request<B>> for BearerAuth<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = AdmissionFuture<S, B, Authenticated>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service is asked for readiness only once the key is
        // known good, so refused requests never hold a permit.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        // Only the header is read here: a request without a good key costs
        // no body buffering and no parse (BodyLimit comes after).
        let client = request
            .extensions()
            .get::<ClientAddr>()
            .map(|client| client.0);
        let presented = presented_key_hash(
            request.headers(),
            &self.words,
            &self.imported,
            &self.checked,
        );
        let (presented, checked_now) = match presented {
            Ok(presented) => presented,
            Err(rejection) => {
                let rejection = AuthFailures::counted(self.failures.as_ref(), client, rejection);
                return AdmissionFuture::rejected(LAYER, rejection);
            }
        };
        // The key is read; it must not travel further, to an upstream or
        // into a log of forwarded headers.
        request.headers_mut().remove(AUTHORIZATION);
        request.headers_mut().remove(X_API_KEY);
        // An address past its failure limit costs no store read: only a key
        // this instance has found live before is looked up and served.
        // A verifier's token has no identity until the verifier has run:
        // it is never known live, so it waits on the same bounds as an
        // unknown key.
        let known_live = match &presented {
            Presented::Hash(hash) => self.directory.is_cached_live(hash),
            Presented::Verify(..) => false,
        };
        if let Some(failures) = &self.failures
            && let Some(retry_after) = failures.blocked(client)
            && !known_live
        {
            return AdmissionFuture::rejected(LAYER, failures.refusal(retry_after));
        }
        // Reads for keys not known live are bounded: many addresses each
        // under their failure limit cannot pile up store reads. One try,
        // never a wait; the place is held until the lookup has answered.
        let lookup_place = match (&self.lookups, known_live) {
            (Some(lookups), false) => match Arc::clone(&lookups.permits).try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => return AdmissionFuture::rejected(LAYER, lookups.refusal()),
            },
            _ => None,
        };
        let path = request.uri().path();
        let messages = messages_call(request.method(), path);
        let held = messages == Some(MessagesCall::Create)
            || (messages.is_none() && is_model_call(request.method(), path));
        // A model call is no key route.
        let route = RouteKind {
            management: !held && messages.is_none() && is_api_path(path),
            held,
        };
        let directory = self.directory.clone();
        let failures = self.failures.clone();
        let words = Arc::clone(&self.words);
        // Kept only once the key is found live: made-up keys never fill it.
        let checked = match (&presented, checked_now) {
            (Presented::Hash(hash), true) => Some((Arc::clone(&self.checked), *hash)),
            _ => None,
        };
        let decision: Decision<Authenticated> = Box::pin(async move {
            let principal = async {
                let hash = identity(presented, &words).await?;
                authenticate(&directory, hash, route, &words).await
            }
            .await
            .map_err(|rejection| AuthFailures::counted(failures.as_ref(), client, rejection))?;
            drop(lookup_place);
            if let Some((checked, hash)) = checked {
                checked.remember(hash);
            }
            // A stack in words of its own: the layers below that refuse a
            // key (CreditGuard, when the store finds it revoked or expired)
            // speak them too.
            let words = (!words.are_default()).then_some(words);
            Ok(Admission {
                additions: Authenticated { principal, words },
                response_headers: Default::default(),
            })
        });
        AdmissionFuture::deciding(LAYER, decision, request, self.inner.clone())
    }
}

/// What BearerAuth adds to a request whose key it accepts: the key's
/// [`Principal`] in the context, and the stack's words (realm, product)
/// when they are not the default, for the layers below that refuse a key.
pub struct Authenticated {
    principal: Principal,
    words: Option<Arc<AuthWords>>,
}

/// The accepted key's principal starts the request's context.
impl<B> Additions<B> for Authenticated {
    fn add_to(self, request: &mut Request<B>) {
        RequestContext::of_mut(request).principal = Some(self.principal);
        if let Some(words) = self.words {
            request.extensions_mut().insert(words);
        }
    }
}

/// The key the request presents, read before any store read, or the 401
/// saying what is wrong with its key headers or its key's shape.
fn presented_key_hash(
    headers: &HeaderMap,
    words: &AuthWords,
    imported: &[ImportedKeys],
    checked: &CheckedKeys,
) -> Result<(Presented, bool), GatewayError> {
    let token = presented_key(headers).map_err(|error| {
        let reason = match error {
            HeaderError::Missing => "missing_authorization",
            HeaderError::WrongScheme => "wrong_scheme",
            HeaderError::ConflictingKeys => "conflicting_keys",
            _ => "malformed_authorization",
        };
        refusal(words, reason, error.message_for(&words.product))
    })?;
    classify_checked(token, imported, Some(checked)).map_err(|not_a_key| match not_a_key {
        NotAKey::BadChecksum => refusal(
            words,
            "unknown_key",
            "unknown API key: its checksum does not match, so it was mistyped or cut short; copy the whole key again",
        ),
        NotAKey::UnknownShape => refusal(words, "unknown_key", unknown_shape(words, imported)),
    })
}

/// The message for a token of no accepted shape: what the service's keys
/// look like.
fn unknown_shape(words: &AuthWords, imported: &[ImportedKeys]) -> String {
    let ours = format!("`{}` ({} characters)", ApiKey::PREFIX, ApiKey::LEN);
    let theirs: Vec<String> = imported
        .iter()
        .flat_map(ImportedKeys::named_prefixes)
        .filter(|prefix| !prefix.is_empty())
        .map(|prefix| format!("`{prefix}`"))
        .collect();
    let shapes = match theirs.is_empty() {
        true => ours,
        false => format!("{ours} or {}", theirs.join(" or ")),
    };
    let issued = match imported.iter().any(ImportedKeys::takes_any_token) {
        // Only an `mg-v1-` token of the wrong shape gets here.
        true => "check that the key was copied whole".to_owned(),
        false => "check that the key is one this service issued".to_owned(),
    };
    format!(
        "unknown API key: {} keys start with {shapes}; {issued}",
        words.product
    )
}

/// The identity of a presented key: its hash, or what the service's
/// verifier says (a 401 when it is no key, a 503 when the verifier fails).
async fn identity(presented: Presented, words: &AuthWords) -> Result<KeyHash, GatewayError> {
    let (verifier, token) = match presented {
        Presented::Hash(hash) => return Ok(hash),
        Presented::Verify(verifier, token) => (verifier, token),
    };
    match verifier.verify(&token).await {
        Ok(Some(id)) => Ok(KeyHash::verified(&id)),
        Ok(None) => Err(no_such_key(words)),
        Err(error) => {
            tracing::warn!(%error, "the key verifier failed; the request is refused with 503");
            Err(GatewayError::new(
                ErrorKind::ServiceUnavailable,
                "the service could not check this API key just now; retry in a moment",
            )
            .with_metadata("reason", "key_verifier_failed")
            .with_retry_after(Duration::from_secs(1)))
        }
    }
}

/// The 401 of a key the service does not have.
fn no_such_key(words: &AuthWords) -> GatewayError {
    refusal(
        words,
        "unknown_key",
        format!(
            "unknown API key: no {} key with this value exists; check the key or create a new one",
            words.product
        ),
    )
}

/// What BearerAuth's decision depends on in the request's route.
#[derive(Clone, Copy, Debug)]
struct RouteKind {
    /// One of the routes of the JSON API (`KeyRoutes`), the
    /// only ones a management key may use.
    management: bool,
    /// A call that holds credits (chat completions, a Messages call but
    /// `count_tokens`): its admission in the ledger refuses a revoked key
    /// by itself, so the cached record is enough.
    held: bool,
}

/// Resolves `hash` to a principal, or the response refusing it.
async fn authenticate(
    directory: &KeyDirectory,
    hash: KeyHash,
    route: RouteKind,
    words: &AuthWords,
) -> Result<Principal, GatewayError> {
    // Other routes never reach the ledger: a live key is read afresh, so
    // that a key revoked on another instance is refused there at once too.
    let state = if route.held {
        directory.lookup(&hash).await
    } else {
        directory.lookup_live(&hash).await
    }
    .map_err(|error| FailurePolicy::refusal("BearerAuth", &error))?;
    let record = match state {
        KeyState::Active(record) => record,
        KeyState::Deleted => {
            return Err(refusal(
                words,
                "deleted_key",
                "this API key was deleted; create a new key",
            ));
        }
        KeyState::Unknown => return Err(no_such_key(words)),
    };
    // Before expiry: a leaked key is named so, whatever else is wrong with it.
    if let Some(leak) = &record.leak {
        return Err(leaked_key_in(words, Some(leak.reported_at)));
    }
    let now = directory.now();
    if let Some(expires_at) = record.expires_at.filter(|_| record.is_expired(now)) {
        return Err(past_expiry_in(
            words,
            expires_at,
            record.rotated_to.is_some(),
        ));
    }
    if record.disabled {
        // Who can lift it: the operator's own key has nobody above it.
        let message = if record.is_operator() {
            "this operator key is disabled (replaced by `proxy reset-operator-key`, or by another operator key); use the current operator key, or run `proxy reset-operator-key` with the gateway's store to make a new one"
        } else if record.disabled_by_operator {
            "this API key was disabled by the gateway's operator; ask the operator to enable it, or use another key"
        } else {
            "this API key is disabled; a management key of its account can enable it (`\"disabled\": false` on the key), or use another key"
        };
        return Err(refusal(words, "disabled_key", message));
    }
    // An allow-list, not a list of model paths: no spelling of a model
    // endpoint, known or yet to come, is open to a management key.
    if record.management && !route.management {
        return Err(GatewayError::new(
            ErrorKind::Forbidden,
            "a management key can only manage keys and accounts; use a normal API key to call models",
        )
        .with_metadata("reason", "management_key"));
    }
    directory.note_use(hash, &record);
    Ok(Principal::from_record(hash, &record))
}

/// The 401 for a key past its expiry (BearerAuth's, or the store's when it
/// decides so in the admission step): `rotated_key` when another key
/// replaced it and its grace has ended.
pub(crate) fn past_expiry(
    words: Option<&AuthWords>,
    expires_at: chrono::DateTime<chrono::Utc>,
    rotated: bool,
) -> GatewayError {
    past_expiry_in(words.unwrap_or(&AuthWords::default()), expires_at, rotated)
}

/// [`past_expiry`] in a stack's words.
fn past_expiry_in(
    words: &AuthWords,
    expires_at: chrono::DateTime<chrono::Utc>,
    rotated: bool,
) -> GatewayError {
    if !rotated {
        return expired_key(words, expires_at);
    }
    refusal(
        words,
        "rotated_key",
        format!(
            "this API key was rotated: the key that replaced it works instead, and this one stopped at {}",
            expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
    )
}

/// The 401 for a key past its expiry.
fn expired_key(words: &AuthWords, expires_at: chrono::DateTime<chrono::Utc>) -> GatewayError {
    refusal(
        words,
        "expired_key",
        format!(
            "this API key expired at {}; create a new key",
            expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
    )
}

/// The 401 of a key reported leaked (`reported_at`, when known): it is
/// disabled for good.
pub(crate) fn leaked_key(
    words: Option<&AuthWords>,
    reported_at: Option<chrono::DateTime<chrono::Utc>>,
) -> GatewayError {
    leaked_key_in(words.unwrap_or(&AuthWords::default()), reported_at)
}

/// [`leaked_key`] in a stack's words.
fn leaked_key_in(
    words: &AuthWords,
    reported_at: Option<chrono::DateTime<chrono::Utc>>,
) -> GatewayError {
    let when = reported_at.map_or_else(String::new, |at| {
        format!(
            " at {}",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )
    });
    refusal(
        words,
        "leaked_key",
        format!(
            "this API key was reported leaked{when} and is disabled for good; delete it and create a new key, and keep the new one out of code and repositories"
        ),
    )
}

/// A 401 with a machine-readable `metadata.reason` and the challenge
/// RFC 6750 asks for, in the realm of `words`.
fn refusal(
    words: &AuthWords,
    reason: &'static str,
    message: impl Into<std::borrow::Cow<'static, str>>,
) -> GatewayError {
    let challenge = if reason == "missing_authorization" {
        words.challenge.clone()
    } else {
        words.invalid_token.clone()
    };
    GatewayError::new(ErrorKind::Authentication, message)
        .with_metadata("reason", reason)
        .with_header(WWW_AUTHENTICATE, challenge)
}
