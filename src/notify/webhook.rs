//! The webhook channel: its settings, the signed payload, and one attempt
//! to deliver it.

use std::fmt;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use http::header::{CONTENT_TYPE, HeaderValue, USER_AGENT};
use http::{Request, Uri};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use sha2::Sha256;

use super::notifier::{ATTEMPT_TIMEOUT, Failure};
use super::{LeakNotice, NotifyConfigError};
use crate::secrets::{MIN_SECRET_BYTES, Secret};

/// The leak notice's payload `type`.
pub const EVENT_TYPE: &str = "key.leaked";
/// The header carrying the attempt's time, in Unix seconds.
pub const TIMESTAMP_HEADER: &str = "x-modelgate-timestamp";
/// The header carrying `sha256=<hex>`: see [`webhook_signature`].
pub const SIGNATURE_HEADER: &str = "x-modelgate-signature";

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Where notices are posted and the secret they are signed with.
/// `Debug` shows only the URL's scheme and host: the secret never, and
/// the path neither, since many hook URLs carry a token in it.
#[derive(Clone)]
pub struct WebhookSettings {
    uri: Uri,
    secret: Secret,
    client: HttpsClient,
}

impl fmt::Debug for WebhookSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSettings")
            .field("url", &shown_url(&self.uri))
            .field("secret", &self.secret)
            .finish()
    }
}

impl WebhookSettings {
    /// Refuses a URL [`new`](Self::new) would refuse, before any secret
    /// is read.
    pub fn check_url(url: &str) -> Result<Uri, NotifyConfigError> {
        // The URL is not repeated in errors: its path may hold a token.
        let uri: Uri = url.parse().map_err(|error| {
            NotifyConfigError::new("webhook_url", format!("not a URL: {error}"))
        })?;
        let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) else {
            return Err(NotifyConfigError::new(
                "webhook_url",
                "needs a scheme and a host, such as https://ops.example.com/hooks/modelgate",
            ));
        };
        if *scheme != http::uri::Scheme::HTTP && *scheme != http::uri::Scheme::HTTPS {
            return Err(NotifyConfigError::new(
                "webhook_url",
                format!("{scheme} is not http or https"),
            ));
        }
        if authority.as_str().contains('@') {
            return Err(NotifyConfigError::new(
                "webhook_url",
                "must not carry a user or password: the signature is the credential",
            ));
        }
        Ok(uri)
    }

    /// Settings for posting to `url` (`http` or `https`, no user or
    /// password in it), signed with `secret` (at least
    /// [`MIN_SECRET_BYTES`] bytes). `https` is checked against the webpki
    /// roots.
    pub fn new(url: &str, secret: Secret) -> Result<Self, NotifyConfigError> {
        let uri = Self::check_url(url)?;
        if secret.expose().len() < MIN_SECRET_BYTES {
            return Err(NotifyConfigError::new(
                "webhook_secret",
                format!("is shorter than {MIN_SECRET_BYTES} bytes"),
            ));
        }
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(ATTEMPT_TIMEOUT));
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        // Notices are rare: a connection kept idle would only be a cost.
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(https);
        Ok(WebhookSettings {
            uri,
            secret,
            client,
        })
    }

    /// The webhook body for `notice`: the same bytes on every attempt.
    pub(super) fn payload(notice: &LeakNotice, delivery_id: &str) -> Result<Bytes, String> {
        Self::event(EVENT_TYPE, delivery_id, notice)
    }

    /// The webhook body `{"type", "id", "data"}`: the same bytes on every
    /// attempt.
    pub(super) fn event<T: Serialize>(
        kind: &'static str,
        delivery_id: &str,
        data: &T,
    ) -> Result<Bytes, String> {
        #[derive(Serialize)]
        struct Payload<'a, T> {
            #[serde(rename = "type")]
            kind: &'static str,
            id: &'a str,
            data: &'a T,
        }
        serde_json::to_vec(&Payload {
            kind,
            id: delivery_id,
            data,
        })
        .map(Bytes::from)
        .map_err(|error| format!("the notice cannot be written as JSON: {error}"))
    }

    /// One attempt to post `body`, signed at `now`.
    pub(super) async fn post(&self, body: Bytes, now: DateTime<Utc>) -> Result<(), Failure> {
        let timestamp_seconds = u64::try_from(now.timestamp()).unwrap_or(0);
        let mut signature =
            HeaderValue::from_str(&webhook_signature(&self.secret, timestamp_seconds, &body))
                .map_err(|_| Failure::permanent("the signature is not a header value"))?;
        signature.set_sensitive(true);
        let request = Request::post(self.uri.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(USER_AGENT, "modelgate-notify")
            .header(TIMESTAMP_HEADER, timestamp_seconds)
            .header(SIGNATURE_HEADER, signature)
            .body(Full::new(body))
            .map_err(|error| Failure::permanent(format!("the request cannot be built: {error}")))?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|error| Failure::transient(super::notifier::error_chain(&error)))?;
        // Only the status counts; the body is dropped unread.
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(Failure::transient(format!("answered {status}")))
        }
    }
}

/// The URL without its path and query.
fn shown_url(uri: &Uri) -> String {
    format!(
        "{}://{}/…",
        uri.scheme_str().unwrap_or(""),
        uri.authority()
            .map(|authority| authority.as_str())
            .unwrap_or("")
    )
}

fn mac(secret: &Secret, timestamp_seconds: u64, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length, so this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.expose().as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(timestamp_seconds.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `X-Modelgate-Signature` value for `body` sent at
/// `timestamp_seconds`: `sha256=` and the lowercase hex HMAC-SHA256, under
/// `secret`, of the timestamp in decimal, a dot, and the body's bytes.
pub fn webhook_signature(secret: &Secret, timestamp_seconds: u64, body: &[u8]) -> String {
    let code = mac(secret, timestamp_seconds, body).finalize().into_bytes();
    format!("sha256={}", hex::encode(code))
}

/// Whether `signature` (the header's value) is `body`'s signature at
/// `timestamp_seconds` (the timestamp header's value) under `secret`, in
/// constant time. How old a timestamp may be is the receiver's choice.
pub fn verify_webhook_signature(
    secret: &Secret,
    timestamp_seconds: u64,
    body: &[u8],
    signature: &str,
) -> bool {
    let Some(code) = signature
        .trim()
        .strip_prefix("sha256=")
        .and_then(|digits| hex::decode(digits).ok())
    else {
        return false;
    };
    mac(secret, timestamp_seconds, body)
        .verify_slice(&code)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secret() -> Secret {
        Secret::new("webhook-secret-0123456789".into())
    }

    #[test]
    fn the_signature_is_sha256_and_lowercase_hex_of_timestamp_dot_body() {
        let signature = webhook_signature(&secret(), 1_700_000_000, b"{\"a\":1}");
        let digits = signature.strip_prefix("sha256=").unwrap();
        assert_eq!(digits.len(), 64);
        assert!(
            digits
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        // Computed apart: HMAC-SHA256(secret, "1700000000.{\"a\":1}").
        let mut expected =
            <Hmac<Sha256> as Mac>::new_from_slice(b"webhook-secret-0123456789").unwrap();
        expected.update(b"1700000000.{\"a\":1}");
        assert_eq!(digits, hex::encode(expected.finalize().into_bytes()));
        // A known answer, so that the format cannot drift unnoticed.
        assert_eq!(
            webhook_signature(&Secret::new("key".into()), 0, b"body"),
            format!("sha256={}", {
                let mut known = <Hmac<Sha256> as Mac>::new_from_slice(b"key").unwrap();
                known.update(b"0.body");
                hex::encode(known.finalize().into_bytes())
            })
        );
        assert!(verify_webhook_signature(
            &secret(),
            1_700_000_000,
            b"{\"a\":1}",
            &signature
        ));
        assert!(verify_webhook_signature(
            &secret(),
            1_700_000_000,
            b"{\"a\":1}",
            &signature.to_ascii_uppercase().replace("SHA256=", "sha256=")
        ));
        for wrong in ["", "sha256=", "sha256=zz", digits, "sha1=00"] {
            assert!(
                !verify_webhook_signature(&secret(), 1_700_000_000, b"{\"a\":1}", wrong),
                "{wrong}"
            );
        }
        let other = Secret::new("another-secret-0123456789".into());
        assert!(!verify_webhook_signature(
            &other,
            1_700_000_000,
            b"{\"a\":1}",
            &signature
        ));
    }

    #[test]
    fn the_payload_is_the_event_its_id_and_the_notice() {
        let notice = crate::notify::email::tests::notice();
        let body = WebhookSettings::payload(&notice, "0123abcd").unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["type"], "key.leaked");
        assert_eq!(json["id"], "0123abcd");
        assert_eq!(json["data"]["account"], "acct_7");
        assert_eq!(json["data"]["email"], "owner@example.com");
        assert_eq!(json["data"]["key_hash_prefix"], "3f9a0c1b2d4e");
        assert_eq!(json["data"]["reported_at"], "2025-03-01T12:30:05Z");
        let back: LeakNotice = serde_json::from_value(json["data"].clone()).unwrap();
        assert_eq!(back, notice);
    }

    #[test]
    fn settings_need_an_http_url_and_a_long_secret_and_never_print_them() {
        let good =
            WebhookSettings::new("https://ops.example.com/hooks/T0KEN-IN-PATH?x=1", secret())
                .unwrap();
        let shown = format!("{good:?}");
        assert!(shown.contains("https://ops.example.com/"), "{shown}");
        assert!(!shown.contains("T0KEN"), "{shown}");
        assert!(!shown.contains("0123456789"), "{shown}");
        assert!(WebhookSettings::new("http://127.0.0.1:9/hook", secret()).is_ok());
        for (url, setting, words) in [
            (
                "ftp://ops.example.com/hook",
                "webhook_url",
                "not http or https",
            ),
            (
                "smtp://ops.example.com/hook",
                "webhook_url",
                "not http or https",
            ),
            (
                "/hooks/only-a-path",
                "webhook_url",
                "needs a scheme and a host",
            ),
            ("not a url at all", "webhook_url", "not a URL"),
            (
                "https://user:pw-secret@ops.example.com/hook",
                "webhook_url",
                "user or password",
            ),
        ] {
            let error = WebhookSettings::new(url, secret()).unwrap_err();
            assert_eq!(error.setting(), setting, "{url}");
            let text = error.to_string();
            assert!(text.contains(words), "{url}: {text}");
            assert!(!text.contains("pw-secret"), "{text}");
        }
        let short = WebhookSettings::new(
            "https://ops.example.com/hook",
            Secret::new("too-short".into()),
        )
        .unwrap_err();
        assert_eq!(short.setting(), "webhook_secret");
        assert!(
            short.to_string().contains("shorter than 16 bytes"),
            "{short}"
        );
        assert!(!short.to_string().contains("too-short"), "{short}");
    }

    proptest! {
        #[test]
        fn signatures_verify_and_change_with_any_byte(
            body in proptest::collection::vec(any::<u8>(), 0..512),
            timestamp in any::<u64>(),
            secret_text in "[ -~]{16,64}",
            flip in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let secret = Secret::new(secret_text);
            let signature = webhook_signature(&secret, timestamp, &body);
            prop_assert!(verify_webhook_signature(&secret, timestamp, &body, &signature));
            if !body.is_empty() {
                let mut changed = body.clone();
                let at = flip.index(changed.len());
                changed[at] ^= 1 << bit;
                prop_assert!(!verify_webhook_signature(&secret, timestamp, &changed, &signature));
                prop_assert_ne!(webhook_signature(&secret, timestamp, &changed), signature.clone());
            }
            let later = timestamp.wrapping_add(1);
            prop_assert!(!verify_webhook_signature(&secret, later, &body, &signature));
            let mut longer = body.clone();
            longer.push(b' ');
            prop_assert!(!verify_webhook_signature(&secret, timestamp, &longer, &signature));
        }
    }
}
