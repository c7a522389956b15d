//! The OAuth routes' inputs, read strictly: the app's callback URL, the
//! body of `POST /api/v1/auth/keys/code` (a management key approving an
//! app) and the body of `POST /api/v1/auth/keys` (the app exchanging its
//! code).
//!
//! Public so a service with its own consent screen parses the same way,
//! and so the fuzz target reaches them. Nothing here panics on any input.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;
use url::{Host, Url};

use super::pkce::{ChallengeMethod, PlainPkce, is_valid_challenge, is_valid_verifier};
use crate::clock::Period;
use crate::error::{ErrorKind, GatewayError};
use crate::json_input::{Fields, bad_request, invalid, missing};
use crate::keys::input::{expiry, key_name, limit_nanos, limit_reset};
use crate::keys::is_valid_account_id;

/// The longest callback URL accepted, in bytes.
pub const MAX_CALLBACK_URL_BYTES: usize = 2048;
/// The longest authorization code read from an exchange, in bytes: longer
/// is refused as malformed before anything else (codes are 43).
pub const MAX_CODE_BYTES: usize = 256;

/// Where the browser goes back to the app: an absolute `https://` URL, or
/// `http://` on the person's own machine only (`localhost`, `127.0.0.1`,
/// `[::1]`), for apps that run there. No user name or password, no
/// fragment, visible ASCII only (punycode for other names), at most
/// [`MAX_CALLBACK_URL_BYTES`]. The consent page applies the same rules.
#[derive(Clone, PartialEq, Eq)]
pub struct CallbackUrl {
    url: Url,
}

/// Why a text is no [`CallbackUrl`]; the message says what to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallbackUrlError {
    /// Empty.
    Empty,
    /// Over [`MAX_CALLBACK_URL_BYTES`].
    TooLong,
    /// A space, a control character or a byte outside ASCII.
    NotVisibleAscii,
    /// Not an absolute URL.
    NotAbsolute,
    /// A scheme other than `https` (or `http` on the person's machine).
    Scheme,
    /// `http` to a host other than `localhost`, `127.0.0.1` or `[::1]`.
    PlainHttpOffLoopback,
    /// A user name or password in the URL.
    Credentials,
    /// A `#fragment`: the code is added to the query, and a fragment would
    /// be kept from the app's server.
    Fragment,
}

impl fmt::Display for CallbackUrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CallbackUrlError::Empty => "is empty",
            CallbackUrlError::TooLong => "is over 2048 bytes",
            CallbackUrlError::NotVisibleAscii => {
                "must be visible ASCII without spaces (percent-encode the rest, punycode a host name)"
            }
            CallbackUrlError::NotAbsolute => {
                "must be an absolute URL such as https://app.example.com/callback"
            }
            CallbackUrlError::Scheme => {
                "must start with https:// (or http:// for localhost, 127.0.0.1 or [::1])"
            }
            CallbackUrlError::PlainHttpOffLoopback => {
                "may use http:// only for localhost, 127.0.0.1 or [::1]; use https:// for any other host"
            }
            CallbackUrlError::Credentials => "must not contain a user name or password",
            CallbackUrlError::Fragment => "must not contain a #fragment",
        })
    }
}

impl std::error::Error for CallbackUrlError {}

impl CallbackUrl {
    /// Reads `text` under the rules above.
    pub fn parse(text: &str) -> Result<CallbackUrl, CallbackUrlError> {
        if text.is_empty() {
            return Err(CallbackUrlError::Empty);
        }
        if text.len() > MAX_CALLBACK_URL_BYTES {
            return Err(CallbackUrlError::TooLong);
        }
        // The URL parser would drop surrounding spaces and inner tabs and
        // newlines without a word: refused here, so what was shown is
        // what is used.
        if !text.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(CallbackUrlError::NotVisibleAscii);
        }
        // Even an empty one (`…/callback#`), which some parsers forget.
        if text.contains('#') {
            return Err(CallbackUrlError::Fragment);
        }
        let url = Url::parse(text).map_err(|_| CallbackUrlError::NotAbsolute)?;
        // The parser percent-encodes some visible characters (`"`, `<`,
        // `{`…): the URL as stored and sent back is held to the bound too.
        if url.as_str().len() > MAX_CALLBACK_URL_BYTES {
            return Err(CallbackUrlError::TooLong);
        }
        match url.scheme() {
            "https" => {}
            "http" => {
                let loopback = match url.host() {
                    Some(Host::Domain(name)) => name == "localhost",
                    Some(Host::Ipv4(address)) => address == std::net::Ipv4Addr::LOCALHOST,
                    Some(Host::Ipv6(address)) => address == std::net::Ipv6Addr::LOCALHOST,
                    None => false,
                };
                if !loopback {
                    return Err(CallbackUrlError::PlainHttpOffLoopback);
                }
            }
            _ => return Err(CallbackUrlError::Scheme),
        }
        // `https:` with no host cannot come from the parser; refused all
        // the same, as the page refuses it.
        if url.host_str().is_none_or(str::is_empty) {
            return Err(CallbackUrlError::NotAbsolute);
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(CallbackUrlError::Credentials);
        }
        Ok(CallbackUrl { url })
    }

    /// The URL as the parser wrote it (host lower case, default port left out).
    pub fn as_str(&self) -> &str {
        self.url.as_str()
    }

    /// Its origin, `scheme://host[:port]`: how the consent page names the app.
    pub fn origin(&self) -> String {
        self.url.origin().ascii_serialization()
    }

    /// Its host (`app.example.com`, `127.0.0.1`, `[::1]`): the app's key is
    /// named after it unless the approval names the key.
    pub fn host(&self) -> &str {
        self.url.host_str().unwrap_or_default()
    }
}

impl fmt::Debug for CallbackUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CallbackUrl").field(&self.as_str()).finish()
    }
}

/// What a management key approves for an app: the body of
/// `POST /api/v1/auth/keys/code`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeRequest {
    /// Where the app waits for the code.
    pub callback_url: CallbackUrl,
    /// The app's PKCE challenge, well formed for its method.
    pub code_challenge: String,
    /// How the challenge was made: `S256`, or `plain` where the gateway
    /// allows it (then also when the request named none, as RFC 7636 says).
    pub code_challenge_method: ChallengeMethod,
    /// The app key's credit limit in nano-credits; `None`: no limit.
    pub limit_nanos: Option<i64>,
    /// When the limit starts again; `None`: never.
    pub limit_reset: Option<Period>,
    /// When the app's key stops working; `None`: never.
    pub expires_at: Option<DateTime<Utc>>,
    /// The app key's name; `None`: the callback URL's host.
    pub key_label: Option<String>,
    /// The account the key is for: required of the operator's key, and
    /// for an account's management key its own account (or absent).
    pub account: Option<String>,
}

/// The fields of [`code_request`].
const CODE_REQUEST_FIELDS: [&str; 8] = [
    "callback_url",
    "code_challenge",
    "code_challenge_method",
    "limit",
    "limit_reset",
    "expires_at",
    "key_label",
    "account",
];

/// Reads the body of `POST /api/v1/auth/keys/code`; `now` bounds
/// `expires_at`, `plain` says whether the `plain` PKCE method is taken. A
/// body that is no JSON object, an unknown field, a missing
/// `callback_url` or `code_challenge`, and (unless `plain` is
/// [`PlainPkce::Allowed`]) a `code_challenge_method` that is absent or
/// `plain` are 400 (the last two with `metadata.reason`
/// `pkce_method_required`, `plain_pkce_refused`); a field of the wrong type
/// or value is 422. Both name the field in `metadata.param`.
pub fn code_request(
    body: &[u8],
    now: DateTime<Utc>,
    plain: PlainPkce,
) -> Result<CodeRequest, GatewayError> {
    let mut fields = Fields::parse(body, &CODE_REQUEST_FIELDS)?;
    let callback_url = fields.take("callback_url").ok_or_else(|| {
        missing(
            "callback_url",
            "name where the app waits for the code, such as https://app.example.com/callback",
        )
    })?;
    let callback_url = match callback_url {
        Value::String(text) => CallbackUrl::parse(&text)
            .map_err(|error| invalid("callback_url", &error.to_string()))?,
        _ => return Err(invalid("callback_url", "must be a string")),
    };
    let code_challenge = fields.take("code_challenge").ok_or_else(|| {
        missing(
            "code_challenge",
            "the app's PKCE challenge (RFC 7636), base64url(SHA-256(code_verifier)) with S256",
        )
    })?;
    let code_challenge_method = match fields.take("code_challenge_method") {
        None | Some(Value::Null) if plain == PlainPkce::Allowed => ChallengeMethod::Plain,
        None | Some(Value::Null) => {
            return Err(missing(
                "code_challenge_method",
                "this gateway takes S256 challenges only; send \"code_challenge_method\": \"S256\" with code_challenge = base64url(SHA-256(code_verifier))",
            )
            .with_metadata("reason", "pkce_method_required"))
        }
        Some(Value::String(text)) => ChallengeMethod::parse(&text).ok_or_else(|| {
            invalid(
                "code_challenge_method",
                "must be \"S256\" or \"plain\" (S256 is the one to use)",
            )
        })?,
        Some(_) => {
            return Err(invalid(
                "code_challenge_method",
                "must be \"S256\" or \"plain\"",
            ))
        }
    };
    if code_challenge_method == ChallengeMethod::Plain && plain == PlainPkce::Refused {
        return Err(bad_request(
            "code_challenge_method",
            "`code_challenge_method` plain is refused on this gateway: with plain the verifier itself travels in the /auth URL. Use \"S256\" with code_challenge = base64url(SHA-256(code_verifier))",
        )
        .with_metadata("reason", "plain_pkce_refused"));
    }
    let code_challenge = match code_challenge {
        Value::String(text) if is_valid_challenge(code_challenge_method, &text) => text,
        _ => {
            return Err(invalid(
                "code_challenge",
                match code_challenge_method {
                    ChallengeMethod::S256 => {
                        "must be 43 base64url characters without padding: the SHA-256 of the code_verifier"
                    }
                    ChallengeMethod::Plain => {
                        "must be 43 to 128 characters of A-Z a-z 0-9 - . _ ~ (the code_verifier itself, with plain)"
                    }
                },
            ));
        }
    };
    let limit_nanos = match fields.take("limit") {
        Some(limit) => limit_nanos(limit)?,
        None => None,
    };
    let limit_reset = match fields.take("limit_reset") {
        Some(reset) => limit_reset(reset)?,
        None => None,
    };
    let expires_at = match fields.take("expires_at") {
        Some(expires_at) => expiry(expires_at, now)?,
        None => None,
    };
    let key_label = match fields.take("key_label") {
        None | Some(Value::Null) => None,
        Some(label) => Some(key_name(label).map_err(|error| renamed(error, "key_label"))?),
    };
    let account = match fields.take("account") {
        None | Some(Value::Null) => None,
        Some(Value::String(account)) if is_valid_account_id(&account) => Some(account),
        Some(_) => {
            return Err(invalid(
                "account",
                "must be 1 to 64 characters of A-Z a-z 0-9 . _ -",
            ));
        }
    };
    Ok(CodeRequest {
        callback_url,
        code_challenge,
        code_challenge_method,
        limit_nanos,
        limit_reset,
        expires_at,
        key_label,
        account,
    })
}

/// The key-name parser speaks of `name`; here the field is `key_label`.
fn renamed(error: GatewayError, field: &str) -> GatewayError {
    let message = error.message().replacen("`name`", &format!("`{field}`"), 1);
    GatewayError::new(error.kind(), message).with_metadata("param", field)
}

/// An app's exchange of its code: the body of `POST /api/v1/auth/keys`.
#[derive(Clone, PartialEq, Eq)]
pub struct ExchangeRequest {
    /// The code the browser brought back, as sent (checked for its shape
    /// by the exchange, as a wrong code: 403).
    pub code: String,
    /// The app's PKCE verifier, well formed.
    pub code_verifier: String,
    /// The method the app says it used; `None`: the one the code was made
    /// with (the token request of RFC 7636 names none).
    pub code_challenge_method: Option<ChallengeMethod>,
}

impl fmt::Debug for ExchangeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The code and the verifier together are a key: neither is printed.
        f.debug_struct("ExchangeRequest")
            .field("code", &format_args!("…"))
            .field("code_verifier", &format_args!("…"))
            .field("code_challenge_method", &self.code_challenge_method)
            .finish()
    }
}

/// The exchange body as JSON gives it; a field given twice or unknown is
/// refused by serde.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExchange {
    #[serde(default)]
    code: Option<Value>,
    #[serde(default)]
    code_verifier: Option<Value>,
    #[serde(default)]
    code_challenge_method: Option<Value>,
}

/// Reads the body of `POST /api/v1/auth/keys`: `code` and `code_verifier`
/// (strings, required), `code_challenge_method` (`S256`, `plain`, or
/// absent or null). Every refusal is 400 with `metadata.param` when one
/// field is at fault; none repeats the code or the verifier.
pub fn exchange_request(body: &[u8]) -> Result<ExchangeRequest, GatewayError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(GatewayError::new(
            ErrorKind::InvalidRequest,
            "the request body is empty; send {\"code\", \"code_verifier\", \"code_challenge_method\"} as JSON",
        ));
    }
    let raw: RawExchange = serde_json::from_slice(body).map_err(|error| {
        // serde's words name the field or the position, never a value.
        GatewayError::new(
            ErrorKind::InvalidRequest,
            format!(
                "the request body must be a JSON object with `code`, `code_verifier` and optionally `code_challenge_method`: {error}"
            ),
        )
    })?;
    let code = match raw.code {
        None | Some(Value::Null) => {
            return Err(missing(
                "code",
                "the code the browser brought back to the callback URL",
            ));
        }
        Some(Value::String(code)) if code.len() <= MAX_CODE_BYTES => code,
        Some(Value::String(_)) => {
            return Err(bad_request(
                "code",
                format!("`code` must be at most {MAX_CODE_BYTES} bytes"),
            ));
        }
        Some(_) => return Err(bad_request("code", "`code` must be a string")),
    };
    let code_verifier = match raw.code_verifier {
        None | Some(Value::Null) => {
            return Err(missing(
                "code_verifier",
                "the PKCE verifier whose challenge the app sent to the consent page",
            ));
        }
        Some(Value::String(verifier)) if is_valid_verifier(&verifier) => verifier,
        Some(_) => {
            return Err(bad_request(
                "code_verifier",
                "`code_verifier` must be a string of 43 to 128 characters of A-Z a-z 0-9 - . _ ~ (RFC 7636)",
            ));
        }
    };
    let code_challenge_method = match raw.code_challenge_method {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(ChallengeMethod::parse(&text).ok_or_else(|| {
            bad_request(
                "code_challenge_method",
                "`code_challenge_method` must be \"S256\" or \"plain\", the method the challenge was made with",
            )
        })?),
        Some(_) => {
            return Err(bad_request(
                "code_challenge_method",
                "`code_challenge_method` must be \"S256\" or \"plain\"",
            ))
        }
    };
    Ok(ExchangeRequest {
        code,
        code_verifier,
        code_challenge_method,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oauth::pkce::s256_challenge;
    use chrono::TimeZone;
    use proptest::prelude::*;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap()
    }

    const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";

    fn refusal<T: fmt::Debug>(result: Result<T, GatewayError>) -> (u16, String, String) {
        let error = result.unwrap_err();
        (
            error.status().as_u16(),
            error
                .metadata()
                .get("param")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            error.message().to_owned(),
        )
    }

    #[test]
    fn callback_urls_are_https_or_loopback_http() {
        for good in [
            "https://app.example.com/callback",
            "https://app.example.com:8443/cb?state=x&y=1",
            "http://localhost:3000/callback",
            "http://127.0.0.1:53682/",
            "http://[::1]:8080/cb",
            "HTTPS://App.Example.COM/cb",
        ] {
            let url = CallbackUrl::parse(good).unwrap_or_else(|error| panic!("{good}: {error}"));
            assert!(url.as_str().starts_with("http"), "{good}");
        }
        for (bad, error) in [
            ("", CallbackUrlError::Empty),
            ("javascript:alert(1)", CallbackUrlError::Scheme),
            ("JavaScript:alert(1)//https://x", CallbackUrlError::Scheme),
            ("data:text/html,hi", CallbackUrlError::Scheme),
            ("ftp://example.com/", CallbackUrlError::Scheme),
            ("myapp://callback", CallbackUrlError::Scheme),
            (
                "http://example.com/cb",
                CallbackUrlError::PlainHttpOffLoopback,
            ),
            (
                "http://localhost.evil.example/cb",
                CallbackUrlError::PlainHttpOffLoopback,
            ),
            (
                "http://127.0.0.2/cb",
                CallbackUrlError::PlainHttpOffLoopback,
            ),
            (
                "https://user:pw@example.com/",
                CallbackUrlError::Credentials,
            ),
            ("https://user@example.com/", CallbackUrlError::Credentials),
            ("https://example.com/cb#frag", CallbackUrlError::Fragment),
            ("https://example.com/cb#", CallbackUrlError::Fragment),
            (" https://example.com/", CallbackUrlError::NotVisibleAscii),
            ("https://exa\tmple.com/", CallbackUrlError::NotVisibleAscii),
            ("https://exämple.com/", CallbackUrlError::NotVisibleAscii),
            ("/callback", CallbackUrlError::NotAbsolute),
            ("https://", CallbackUrlError::NotAbsolute),
            ("example.com/callback", CallbackUrlError::NotAbsolute),
        ] {
            assert_eq!(CallbackUrl::parse(bad), Err(error), "{bad:?}");
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_CALLBACK_URL_BYTES));
        assert_eq!(CallbackUrl::parse(&long), Err(CallbackUrlError::TooLong));
        // Within the bound as sent, over it once `"` is written `%22`.
        let quoted = format!("https://example.com/{}", "\"".repeat(1000));
        assert!(quoted.len() <= MAX_CALLBACK_URL_BYTES);
        assert_eq!(CallbackUrl::parse(&quoted), Err(CallbackUrlError::TooLong));
    }

    #[test]
    fn the_app_is_named_by_origin_and_host() {
        let url = CallbackUrl::parse("https://App.example.com:8443/cb?state=s%20t").unwrap();
        assert_eq!(url.origin(), "https://app.example.com:8443");
        assert_eq!(url.host(), "app.example.com");
        assert_eq!(url.as_str(), "https://app.example.com:8443/cb?state=s%20t");
        let loopback = CallbackUrl::parse("http://[::1]:8080/cb").unwrap();
        assert_eq!(loopback.host(), "[::1]");
        assert_eq!(loopback.origin(), "http://[::1]:8080");
    }

    #[test]
    fn a_full_code_request_reads_every_field() {
        let challenge = s256_challenge(VERIFIER);
        let body = json!({
            "callback_url": "https://app.example.com/cb",
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "limit": 2.5,
            "limit_reset": "monthly",
            "expires_at": "2027-01-01T00:00:00Z",
            "key_label": " Example app ",
            "account": "acme",
        });
        let request = code_request(body.to_string().as_bytes(), now(), PlainPkce::Refused).unwrap();
        assert_eq!(request.callback_url.as_str(), "https://app.example.com/cb");
        assert_eq!(request.code_challenge, challenge);
        assert_eq!(request.code_challenge_method, ChallengeMethod::S256);
        assert_eq!(request.limit_nanos, Some(2_500_000_000));
        assert_eq!(request.limit_reset, Some(Period::Month));
        assert_eq!(
            request.expires_at,
            Some(Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap())
        );
        assert_eq!(request.key_label.as_deref(), Some("Example app"));
        assert_eq!(request.account.as_deref(), Some("acme"));

        // Where the operator allows plain, the method defaults to it, as
        // RFC 7636 says.
        let minimal =
            json!({"callback_url": "http://localhost:3000/cb", "code_challenge": VERIFIER});
        let request =
            code_request(minimal.to_string().as_bytes(), now(), PlainPkce::Allowed).unwrap();
        assert_eq!(request.code_challenge_method, ChallengeMethod::Plain);
        assert_eq!(
            (request.limit_nanos, request.limit_reset, request.expires_at),
            (None, None, None)
        );
        assert_eq!((request.key_label, request.account), (None, None));
    }

    #[test]
    fn code_requests_are_refused_field_by_field() {
        let challenge = s256_challenge(VERIFIER);
        let with = |change: Value| {
            let mut body = json!({
                "callback_url": "https://app.example.com/cb",
                "code_challenge": challenge,
                "code_challenge_method": "S256",
            });
            for (field, value) in change.as_object().unwrap() {
                if value == "<absent>" {
                    body.as_object_mut().unwrap().remove(field);
                } else {
                    body[field] = value.clone();
                }
            }
            refusal(code_request(
                body.to_string().as_bytes(),
                now(),
                PlainPkce::Refused,
            ))
        };
        for (change, status, param) in [
            (json!({"callback_url": "<absent>"}), 400, "callback_url"),
            (
                json!({"callback_url": "javascript:alert(1)"}),
                422,
                "callback_url",
            ),
            (
                json!({"callback_url": "http://example.com/"}),
                422,
                "callback_url",
            ),
            (json!({"callback_url": 7}), 422, "callback_url"),
            (json!({"code_challenge": "<absent>"}), 400, "code_challenge"),
            (json!({"code_challenge": "short"}), 422, "code_challenge"),
            (
                json!({"code_challenge": VERIFIER.repeat(2)}),
                422,
                "code_challenge",
            ),
            (json!({"code_challenge": null}), 422, "code_challenge"),
            (
                json!({"code_challenge_method": "s256"}),
                422,
                "code_challenge_method",
            ),
            (
                json!({"code_challenge_method": 256}),
                422,
                "code_challenge_method",
            ),
            (json!({"limit": -1}), 422, "limit"),
            (json!({"limit": "5"}), 422, "limit"),
            (json!({"limit_reset": "hourly"}), 422, "limit_reset"),
            (
                json!({"expires_at": "2020-01-01T00:00:00Z"}),
                422,
                "expires_at",
            ),
            (json!({"expires_at": "tomorrow"}), 422, "expires_at"),
            (json!({"key_label": ""}), 422, "key_label"),
            (json!({"key_label": "a\nb"}), 422, "key_label"),
            (json!({"account": "no spaces"}), 422, "account"),
            (json!({"redirect_uri": "https://x"}), 400, "redirect_uri"),
        ] {
            let (got_status, got_param, message) = with(change.clone());
            assert_eq!(
                (got_status, got_param.as_str()),
                (status, param),
                "{change}: {message}"
            );
            assert!(message.contains(param), "{change}: {message}");
        }
        let (status, _, message) = with(json!({"key_label": ""}));
        assert_eq!(status, 422);
        assert!(message.starts_with("`key_label`"), "{message}");
        for body in [&b""[..], b"[]", b"{", b"null"] {
            assert_eq!(
                refusal(code_request(body, now(), PlainPkce::Refused)).0,
                400
            );
        }
    }

    #[test]
    fn plain_and_an_absent_method_are_400s_unless_the_operator_allows_plain() {
        let approval = |method: Option<&str>| {
            let mut body =
                json!({"callback_url": "https://app.example.com/cb", "code_challenge": VERIFIER});
            if let Some(method) = method {
                body["code_challenge_method"] = json!(method);
            }
            body.to_string()
        };
        let reason = |result: Result<CodeRequest, GatewayError>| {
            let error = result.unwrap_err();
            assert_eq!(error.status().as_u16(), 400, "{}", error.message());
            assert_eq!(error.metadata()["param"], "code_challenge_method");
            assert!(error.message().contains("S256"), "{}", error.message());
            error.metadata()["reason"].as_str().unwrap().to_owned()
        };
        let refused = |method| code_request(approval(method).as_bytes(), now(), PlainPkce::Refused);
        assert_eq!(reason(refused(None)), "pkce_method_required");
        assert_eq!(reason(refused(Some("plain"))), "plain_pkce_refused");
        // A JSON null is no method either.
        let null = json!({"callback_url": "https://app.example.com/cb",
                          "code_challenge": VERIFIER, "code_challenge_method": null});
        assert_eq!(
            reason(code_request(
                null.to_string().as_bytes(),
                now(),
                PlainPkce::Refused
            )),
            "pkce_method_required"
        );
        let allowed = |method| code_request(approval(method).as_bytes(), now(), PlainPkce::Allowed);
        for method in [None, Some("plain")] {
            let request = allowed(method).unwrap();
            assert_eq!(request.code_challenge_method, ChallengeMethod::Plain);
            assert_eq!(request.code_challenge, VERIFIER);
        }
        // S256 is taken either way; an unknown method stays a 422.
        for plain in [PlainPkce::Refused, PlainPkce::Allowed] {
            let body = json!({"callback_url": "https://app.example.com/cb",
                              "code_challenge": s256_challenge(VERIFIER), "code_challenge_method": "S256"});
            assert!(code_request(body.to_string().as_bytes(), now(), plain).is_ok());
            let (status, param, _) = refusal(code_request(
                approval(Some("S512")).as_bytes(),
                now(),
                plain,
            ));
            assert_eq!((status, param.as_str()), (422, "code_challenge_method"));
        }
    }

    #[test]
    fn exchanges_need_a_code_and_a_verifier() {
        let request = exchange_request(
            json!({"code": "abc", "code_verifier": VERIFIER, "code_challenge_method": "S256"})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(request.code, "abc");
        assert_eq!(request.code_verifier, VERIFIER);
        assert_eq!(request.code_challenge_method, Some(ChallengeMethod::S256));
        assert!(!format!("{request:?}").contains(VERIFIER));
        let request = exchange_request(
            json!({"code": "abc", "code_verifier": VERIFIER})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(request.code_challenge_method, None);

        for (body, param) in [
            (json!({"code_verifier": VERIFIER}), "code"),
            (json!({"code": null, "code_verifier": VERIFIER}), "code"),
            (json!({"code": 5, "code_verifier": VERIFIER}), "code"),
            (
                json!({"code": "a".repeat(MAX_CODE_BYTES + 1), "code_verifier": VERIFIER}),
                "code",
            ),
            (json!({"code": "abc"}), "code_verifier"),
            (
                json!({"code": "abc", "code_verifier": "short"}),
                "code_verifier",
            ),
            (
                json!({"code": "abc", "code_verifier": VERIFIER, "code_challenge_method": "S512"}),
                "code_challenge_method",
            ),
            (
                json!({"code": "abc", "code_verifier": VERIFIER, "code_challenge_method": ["S256"]}),
                "code_challenge_method",
            ),
        ] {
            let (status, got, message) = refusal(exchange_request(body.to_string().as_bytes()));
            assert_eq!((status, got.as_str()), (400, param), "{body}: {message}");
            assert!(!message.contains(VERIFIER), "{message}");
        }
        for body in [
            &b""[..],
            b"  ",
            b"not json",
            b"[]",
            br#"{"code": "a", "code_verifier": "b", "grant_type": "authorization_code"}"#,
            br#"{"code": "a", "code": "b"}"#,
        ] {
            let (status, _, message) = refusal(exchange_request(body));
            assert_eq!(status, 400, "{message}");
        }
    }

    proptest! {
        #[test]
        fn no_text_panics_the_url_check_and_what_passes_is_http(text in "\\PC{0,80}") {
            if let Ok(url) = CallbackUrl::parse(&text) {
                prop_assert!(url.as_str().starts_with("https://") || url.as_str().starts_with("http://"));
                prop_assert!(!url.as_str().contains('#'));
                prop_assert!(!url.host().is_empty());
            }
        }

        #[test]
        fn https_urls_of_any_path_and_query_pass(
            host in "[a-z][a-z0-9]{0,20}(\\.[a-z]{2,6}){1,2}",
            path in "(/[A-Za-z0-9._~-]{0,10}){0,4}",
            query in "([a-z]{1,5}=[A-Za-z0-9]{0,5}&?){0,3}",
        ) {
            let text = if query.is_empty() {
                format!("https://{host}{path}")
            } else {
                format!("https://{host}{path}?{query}")
            };
            let url = CallbackUrl::parse(&text).unwrap();
            prop_assert_eq!(url.host(), host.as_str());
            prop_assert_eq!(url.origin(), format!("https://{host}"));
        }

        #[test]
        fn no_body_panics_the_parsers(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            for plain in [PlainPkce::Refused, PlainPkce::Allowed] {
                if let Err(error) = code_request(&body, now(), plain) {
                    prop_assert!(matches!(error.status().as_u16(), 400 | 422));
                }
            }
            if let Err(error) = exchange_request(&body) {
                prop_assert_eq!(error.status().as_u16(), 400);
            }
        }

        #[test]
        fn json_shaped_bodies_never_panic_the_parsers(
            callback in "\\PC{0,40}",
            challenge in "[A-Za-z0-9._~+/=-]{0,130}",
            method in proptest::option::of("(S256|plain|s256|)"),
            limit in proptest::option::of(-5.0f64..1e12),
        ) {
            let body = json!({
                "callback_url": callback, "code_challenge": challenge,
                "code_challenge_method": method, "limit": limit,
            });
            for plain in [PlainPkce::Refused, PlainPkce::Allowed] {
                match code_request(body.to_string().as_bytes(), now(), plain) {
                    Ok(request) => {
                        prop_assert!(is_valid_challenge(request.code_challenge_method, &request.code_challenge));
                        prop_assert!(request.limit_nanos.is_none_or(|nanos| nanos >= 0));
                        // Only an operator who allows plain gets a plain code.
                        prop_assert!(
                            plain == PlainPkce::Allowed
                                || request.code_challenge_method == ChallengeMethod::S256
                        );
                    }
                    Err(error) => prop_assert!(matches!(error.status().as_u16(), 400 | 422)),
                }
            }
            let exchange = json!({"code": callback, "code_verifier": challenge, "code_challenge_method": method});
            match exchange_request(exchange.to_string().as_bytes()) {
                Ok(request) => prop_assert!(is_valid_verifier(&request.code_verifier)),
                Err(error) => prop_assert_eq!(error.status().as_u16(), 400),
            }
        }
    }
}
