//! The key a request presents: `Authorization` with exactly `Bearer`, one
//! space and the key (OpenAI's clients), or `x-api-key` with the key alone
//! (Anthropic's); both at once only when they name the same key.
//!
//! Strict on purpose: a key pasted with a trailing newline, a doubled space
//! or a second header is a client bug worth a clear 401, not something to
//! guess around, and a line break inside a header value is how header
//! injection starts.

use std::fmt;

use http::HeaderMap;
use http::header::{AUTHORIZATION, HeaderName};

use super::words::DEFAULT_PRODUCT;

/// The header Anthropic's clients (its SDKs, Claude Code with
/// `ANTHROPIC_API_KEY`) send their key in, with nothing else.
pub const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The longest `Authorization` value read, in bytes. A modelgate key is 55
/// bytes; the bound leaves room for other bearer tokens while keeping a
/// hostile header from costing more than one short scan.
pub const MAX_AUTHORIZATION_BYTES: usize = 1024;

/// Why an `Authorization` header gives no key.
///
/// When a value breaks several rules, the error is the first that applies
/// in this order, wherever in the value the faults are:
///
/// 1. [`Missing`](HeaderError::Missing), then
///    [`Repeated`](HeaderError::Repeated) (only from [`bearer_token`]);
/// 2. [`TooLong`](HeaderError::TooLong), decided on the length alone;
/// 3. [`ControlCharacter`](HeaderError::ControlCharacter);
/// 4. [`StrayWhitespace`](HeaderError::StrayWhitespace);
/// 5. [`WrongScheme`](HeaderError::WrongScheme);
/// 6. [`MissingKey`](HeaderError::MissingKey);
/// 7. [`InvalidCharacter`](HeaderError::InvalidCharacter).
///
/// So any value within the size limit that has a stray space, tab or line
/// break is rejected for that, whatever its scheme. The
/// [`Display`](fmt::Display) text is the message for the 401: it says what
/// is wrong and what to send, and never repeats the header's value.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderError {
    /// The request has no `Authorization` header.
    Missing,
    /// The request has more than one `Authorization` header.
    Repeated,
    /// The value is longer than `max_bytes`.
    TooLong {
        /// The limit, [`MAX_AUTHORIZATION_BYTES`].
        max_bytes: usize,
    },
    /// The value does not start with the `Bearer` scheme (compared
    /// ASCII-case-insensitively): another scheme such as `Basic`, a bare key
    /// with no scheme, or an empty value.
    WrongScheme,
    /// `Bearer` with no key after it.
    MissingKey,
    /// A space or tab other than the one space between `Bearer` and the key:
    /// leading, trailing, doubled, or inside the key.
    StrayWhitespace,
    /// A control character: a byte below 0x20 other than tab (so CR and LF),
    /// or DEL (0x7f).
    ControlCharacter,
    /// The key has a character a bearer token cannot have (outside
    /// `A-Z a-z 0-9 - . _ ~ + /`, with `=` only as trailing padding),
    /// including any non-ASCII byte.
    InvalidCharacter,
    /// The `x-api-key` header is not one key alone (only from
    /// [`presented_key`]).
    ApiKey(ApiKeyFault),
    /// `Authorization` and `x-api-key` name two different keys (only from
    /// [`presented_key`]): which one the client meant is a guess.
    ConflictingKeys,
}

/// What is wrong with an `x-api-key` header, checked in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApiKeyFault {
    /// More than one `x-api-key` header.
    Repeated,
    /// Longer than `max_bytes`.
    TooLong {
        /// The limit, [`MAX_AUTHORIZATION_BYTES`].
        max_bytes: usize,
    },
    /// A control character (CR, LF, DEL, …).
    ControlCharacter,
    /// A space or tab anywhere: the value is the key alone.
    Whitespace,
    /// An empty value.
    Empty,
    /// A character no key has (as for [`HeaderError::InvalidCharacter`]).
    InvalidCharacter,
}

impl HeaderError {
    /// The 401's message, naming keys as `product`'s (`your acme key`);
    /// [`Display`](fmt::Display) names them modelgate's.
    pub fn message_for(&self, product: &str) -> String {
        Words {
            error: self,
            product,
        }
        .to_string()
    }
}

/// A [`HeaderError`] or [`ApiKeyFault`] told in a product's words.
struct Words<'a, E> {
    error: &'a E,
    product: &'a str,
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(
            &Words {
                error: self,
                product: DEFAULT_PRODUCT,
            },
            f,
        )
    }
}

impl fmt::Display for Words<'_, HeaderError> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let product = self.product;
        match self.error {
            HeaderError::Missing => write!(
                f,
                "the request has no Authorization header; \
                 send `Authorization: Bearer <your {product} key>` \
                 (or `x-api-key: <your {product} key>`, as Anthropic's clients do)",
            ),
            HeaderError::Repeated => write!(
                f,
                "the request has more than one Authorization header; send exactly one, \
                 `Authorization: Bearer <your {product} key>`",
            ),
            HeaderError::TooLong { max_bytes } => write!(
                f,
                "the Authorization header is longer than {max_bytes} bytes; \
                 send `Bearer`, one space and your {product} key, nothing else"
            ),
            HeaderError::WrongScheme => write!(
                f,
                "the Authorization header does not use the Bearer scheme; \
                 send `Authorization: Bearer <your {product} key>`",
            ),
            HeaderError::MissingKey => write!(
                f,
                "the Authorization header has no key after `Bearer`; \
                 send `Authorization: Bearer <your {product} key>`",
            ),
            HeaderError::StrayWhitespace => write!(
                f,
                "the Authorization header has extra spaces or tabs; send `Bearer`, exactly one \
                 space and the key, with nothing before, after or inside the key",
            ),
            HeaderError::ControlCharacter => write!(
                f,
                "the Authorization header contains a line break or another control character; \
                 remove it (a newline copied along with the key is the usual cause) and send \
                 `Bearer`, one space and the key",
            ),
            HeaderError::InvalidCharacter => write!(
                f,
                "the key in the Authorization header contains characters no key has; \
                 copy the whole key and nothing else, and send \
                 `Authorization: Bearer <your {product} key>`",
            ),
            HeaderError::ApiKey(fault) => fmt::Display::fmt(
                &Words {
                    error: fault,
                    product,
                },
                f,
            ),
            HeaderError::ConflictingKeys => write!(
                f,
                "the Authorization and x-api-key headers hold two different keys; send one key \
                 in one of them (for Claude Code, set only one of ANTHROPIC_AUTH_TOKEN and \
                 ANTHROPIC_API_KEY)",
            ),
        }
    }
}

impl fmt::Display for ApiKeyFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(
            &Words {
                error: self,
                product: DEFAULT_PRODUCT,
            },
            f,
        )
    }
}

impl fmt::Display for Words<'_, ApiKeyFault> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let product = self.product;
        match self.error {
            ApiKeyFault::Repeated => write!(
                f,
                "the request has more than one x-api-key header; send exactly one, \
                 `x-api-key: <your {product} key>`",
            ),
            ApiKeyFault::TooLong { max_bytes } => write!(
                f,
                "the x-api-key header is longer than {max_bytes} bytes; send your {product} key \
                 alone, nothing else"
            ),
            ApiKeyFault::ControlCharacter => write!(
                f,
                "the x-api-key header contains a line break or another control character; \
                 remove it (a newline copied along with the key is the usual cause)",
            ),
            ApiKeyFault::Whitespace => write!(
                f,
                "the x-api-key header has spaces or tabs; send the key alone, with no scheme \
                 and nothing before, after or inside it",
            ),
            ApiKeyFault::Empty => write!(
                f,
                "the x-api-key header is empty; send `x-api-key: <your {product} key>`, or \
                 leave the header out and send `Authorization: Bearer <your {product} key>`",
            ),
            ApiKeyFault::InvalidCharacter => write!(
                f,
                "the key in the x-api-key header contains characters no key has; \
                 copy the whole key and nothing else",
            ),
        }
    }
}

impl std::error::Error for HeaderError {}

/// The key from the request's one `Authorization` header.
///
/// [`HeaderError::Missing`] without the header, [`HeaderError::Repeated`]
/// with more than one (which one the client meant is a guess), and
/// otherwise what [`parse_bearer`] says about its value.
///
/// ```
/// use http::header::{HeaderMap, HeaderValue, AUTHORIZATION};
/// use modelgate::auth::{bearer_token, HeaderError};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(bearer_token(&headers), Err(HeaderError::Missing));
/// headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer abc123"));
/// assert_eq!(bearer_token(&headers), Ok("abc123"));
/// headers.append(AUTHORIZATION, HeaderValue::from_static("Bearer abc123"));
/// assert_eq!(bearer_token(&headers), Err(HeaderError::Repeated));
/// ```
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, HeaderError> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values.next().ok_or(HeaderError::Missing)?;
    if values.next().is_some() {
        return Err(HeaderError::Repeated);
    }
    parse_bearer(value.as_bytes())
}

/// The key the request presents, in its one `Authorization` header
/// ([`bearer_token`]'s rules) or its one `x-api-key` header
/// ([`parse_api_key`]'s), or in both when both name the same key.
///
/// A fault in either header is reported even when the other is good (the
/// `Authorization` header's first), and two different keys are
/// [`HeaderError::ConflictingKeys`]: the client's intent is never guessed.
///
/// ```
/// use http::header::{HeaderMap, HeaderValue, AUTHORIZATION};
/// use modelgate::auth::{presented_key, HeaderError, X_API_KEY};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(X_API_KEY, HeaderValue::from_static("abc123"));
/// assert_eq!(presented_key(&headers), Ok("abc123"));
/// headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer abc123"));
/// assert_eq!(presented_key(&headers), Ok("abc123"));
/// headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer xyz789"));
/// assert_eq!(presented_key(&headers), Err(HeaderError::ConflictingKeys));
/// ```
pub fn presented_key(headers: &HeaderMap) -> Result<&str, HeaderError> {
    let from_api_key = || -> Result<Option<&str>, HeaderError> {
        let mut values = headers.get_all(X_API_KEY).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(HeaderError::ApiKey(ApiKeyFault::Repeated));
        }
        parse_api_key(value.as_bytes())
            .map(Some)
            .map_err(HeaderError::ApiKey)
    };
    match bearer_token(headers) {
        Err(HeaderError::Missing) => from_api_key()?.ok_or(HeaderError::Missing),
        Err(error) => Err(error),
        Ok(bearer) => match from_api_key()? {
            Some(other) if other != bearer => Err(HeaderError::ConflictingKeys),
            _ => Ok(bearer),
        },
    }
}

/// The key from an `x-api-key` header's value: the key alone, with the
/// characters and the length [`parse_bearer`] allows a key.
///
/// ```
/// use modelgate::auth::{parse_api_key, ApiKeyFault};
///
/// assert_eq!(parse_api_key(b"abc123"), Ok("abc123"));
/// assert_eq!(parse_api_key(b"Bearer abc123"), Err(ApiKeyFault::Whitespace));
/// assert_eq!(parse_api_key(b""), Err(ApiKeyFault::Empty));
/// ```
pub fn parse_api_key(value: &[u8]) -> Result<&str, ApiKeyFault> {
    if value.len() > MAX_AUTHORIZATION_BYTES {
        return Err(ApiKeyFault::TooLong {
            max_bytes: MAX_AUTHORIZATION_BYTES,
        });
    }
    if value.iter().any(|&byte| is_control(byte)) {
        return Err(ApiKeyFault::ControlCharacter);
    }
    if value.iter().any(|&byte| byte == b' ' || byte == b'\t') {
        return Err(ApiKeyFault::Whitespace);
    }
    if value.is_empty() {
        return Err(ApiKeyFault::Empty);
    }
    if !is_token68(value) {
        return Err(ApiKeyFault::InvalidCharacter);
    }
    std::str::from_utf8(value).map_err(|_| ApiKeyFault::InvalidCharacter)
}

/// The key from one header value's bytes.
///
/// The value must be `Bearer` (any ASCII case), one space (0x20), then a
/// token68 key, with nothing before or after. The key returned borrows from
/// `value`. See [`HeaderError`] for the order in which faults are reported.
///
/// ```
/// use modelgate::auth::{parse_bearer, HeaderError};
///
/// assert_eq!(parse_bearer(b"Bearer abc123"), Ok("abc123"));
/// assert_eq!(parse_bearer(b"bearer abc123"), Ok("abc123"));
/// assert_eq!(parse_bearer(b"Bearer  abc123"), Err(HeaderError::StrayWhitespace));
/// assert_eq!(parse_bearer(b"Bearer abc123\r\n"), Err(HeaderError::ControlCharacter));
/// assert_eq!(parse_bearer(b"Basic abc123"), Err(HeaderError::WrongScheme));
/// ```
pub fn parse_bearer(value: &[u8]) -> Result<&str, HeaderError> {
    if value.len() > MAX_AUTHORIZATION_BYTES {
        return Err(HeaderError::TooLong {
            max_bytes: MAX_AUTHORIZATION_BYTES,
        });
    }
    // One pass finds what the checks below report, in their order.
    let (mut control, mut tab, mut spaces, mut first_space) = (false, false, 0, None);
    for (at, &byte) in value.iter().enumerate() {
        match byte {
            b' ' => {
                first_space = first_space.or(Some(at));
                spaces += 1;
            }
            b'\t' => tab = true,
            byte if is_control(byte) => control = true,
            _ => {}
        }
    }
    if control {
        return Err(HeaderError::ControlCharacter);
    }
    // The first space is the separator unless it leads; any other is stray.
    if tab || spaces > 1 || first_space == Some(0) {
        return Err(HeaderError::StrayWhitespace);
    }
    let (scheme, key) = match first_space {
        Some(at) => (&value[..at], Some(&value[at + 1..])),
        None => (value, None),
    };
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err(HeaderError::WrongScheme);
    }
    let key = match key {
        Some(key) if !key.is_empty() => key,
        _ => return Err(HeaderError::MissingKey),
    };
    if !is_token68(key) {
        return Err(HeaderError::InvalidCharacter);
    }
    // Always ASCII by now; the error arm only spares an unwrap.
    std::str::from_utf8(key).map_err(|_| HeaderError::InvalidCharacter)
}

/// Control bytes other than tab, which is reported as whitespace.
fn is_control(byte: u8) -> bool {
    (byte < 0x20 && byte != b'\t') || byte == 0x7f
}

/// RFC 9110's token68: `1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="`.
fn is_token68(key: &[u8]) -> bool {
    let body = key
        .iter()
        .take_while(|&&byte| TOKEN68_CHARS[usize::from(byte)])
        .count();
    body > 0 && key.iter().skip(body).all(|&byte| byte == b'=')
}

/// token68's characters before its `=` padding, by byte: a key is checked
/// on every request.
const TOKEN68_CHARS: [bool; 256] = {
    let mut chars = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        chars[byte] =
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/');
        byte += 1;
    }
    chars
};

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    const KEY: &str = "mg-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4C";

    fn parse(value: &str) -> Result<&str, HeaderError> {
        parse_bearer(value.as_bytes())
    }

    #[test]
    fn bearer_and_one_space_then_the_key_parses() {
        let value = format!("Bearer {KEY}");
        assert_eq!(parse(&value), Ok(KEY));
    }

    #[test]
    fn the_scheme_is_case_insensitive() {
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            assert_eq!(parse(&format!("{scheme} {KEY}")), Ok(KEY), "{scheme}");
        }
    }

    #[test]
    fn every_token68_character_and_trailing_padding_is_accepted() {
        for key in ["aZ09-._~+/", "abc=", "abc==", "a", "/", "~~=="] {
            assert_eq!(parse(&format!("Bearer {key}")), Ok(key), "{key}");
        }
    }

    #[test]
    fn the_key_borrows_from_the_input() {
        let value = format!("Bearer {KEY}");
        let key = parse(&value).unwrap();
        assert_eq!(key.as_ptr(), value[7..].as_ptr());
    }

    #[test]
    fn missing_header() {
        assert_eq!(bearer_token(&HeaderMap::new()), Err(HeaderError::Missing));
    }

    #[test]
    fn repeated_header_even_when_both_are_valid() {
        let mut headers = HeaderMap::new();
        let value = HeaderValue::from_str(&format!("Bearer {KEY}")).unwrap();
        headers.append(AUTHORIZATION, value.clone());
        assert_eq!(bearer_token(&headers), Ok(KEY));
        headers.append(AUTHORIZATION, value);
        assert_eq!(bearer_token(&headers), Err(HeaderError::Repeated));
    }

    #[test]
    fn repeated_wins_over_a_bad_value() {
        let mut headers = HeaderMap::new();
        headers.append(AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        headers.append(AUTHORIZATION, HeaderValue::from_static("Bearer  abc"));
        assert_eq!(bearer_token(&headers), Err(HeaderError::Repeated));
    }

    #[test]
    fn the_header_name_is_case_insensitive() {
        let mut headers = HeaderMap::new();
        headers.insert("AUTHORIZATION", HeaderValue::from_static("Bearer abc"));
        assert_eq!(bearer_token(&headers), Ok("abc"));
    }

    #[test]
    fn too_long_at_one_byte_over_the_limit() {
        let fits = format!("Bearer {}", "a".repeat(MAX_AUTHORIZATION_BYTES - 7));
        assert_eq!(fits.len(), MAX_AUTHORIZATION_BYTES);
        assert!(parse(&fits).is_ok());
        let over = format!("{fits}a");
        assert_eq!(
            parse(&over),
            Err(HeaderError::TooLong {
                max_bytes: MAX_AUTHORIZATION_BYTES
            })
        );
    }

    #[test]
    fn too_long_is_decided_before_anything_else() {
        let over = format!("Basic \r\n  {}", "\u{e9}".repeat(MAX_AUTHORIZATION_BYTES));
        assert!(matches!(parse(&over), Err(HeaderError::TooLong { .. })));
    }

    #[test]
    fn wrong_scheme() {
        for value in [
            "Basic dXNlcjpwYXNz",
            "Token abc",
            "Bearerabc",
            "Bearer:abc",
            KEY,
            "",
            "Béarer abc",
        ] {
            assert_eq!(parse(value), Err(HeaderError::WrongScheme), "{value:?}");
        }
    }

    #[test]
    fn missing_key() {
        for value in ["Bearer", "Bearer ", "bearer", "BEARER "] {
            assert_eq!(parse(value), Err(HeaderError::MissingKey), "{value:?}");
        }
    }

    #[test]
    fn stray_whitespace() {
        for value in [
            " Bearer abc",
            "Bearer abc ",
            "Bearer  abc",
            "Bearer ab c",
            "Bearer\tabc",
            "Bearer abc\t",
            "\tBearer abc",
            " ",
            "  ",
            "Bearer  ",
            // Whitespace wins over the scheme: any stray space is reported as such.
            "Basic  abc",
            " abc",
            "Basic a b",
        ] {
            assert_eq!(parse(value), Err(HeaderError::StrayWhitespace), "{value:?}");
        }
    }

    #[test]
    fn control_characters_including_line_breaks() {
        for value in [
            "Bearer abc\r\n",
            "Bearer abc\n",
            "Bearer ab\rc",
            "\nBearer abc",
            "Bearer\r\nabc",
            "Bearer abc\0",
            "Bearer abc\u{7f}",
            "Bearer a\u{1b}bc",
            // Control characters win over stray whitespace and the scheme.
            "Basic  abc\n",
        ] {
            assert_eq!(
                parse(value),
                Err(HeaderError::ControlCharacter),
                "{value:?}"
            );
        }
        assert!(
            HeaderError::ControlCharacter
                .to_string()
                .contains("line break")
        );
    }

    #[test]
    fn invalid_characters_in_the_key() {
        for value in [
            "Bearer abc=def",
            "Bearer =",
            "Bearer ==abc",
            "Bearer ab\"c",
            "Bearer ab,c",
            "Bearer ab;c",
            "Bearer k\u{e9}y",
            "Bearer abc\u{a0}",
        ] {
            assert_eq!(
                parse(value),
                Err(HeaderError::InvalidCharacter),
                "{value:?}"
            );
        }
        // obs-text bytes that are not UTF-8, as a HeaderValue may hold them.
        assert_eq!(
            parse_bearer(b"Bearer ab\xffc"),
            Err(HeaderError::InvalidCharacter)
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_bytes(b"Bearer \x80\x81").unwrap(),
        );
        assert_eq!(bearer_token(&headers), Err(HeaderError::InvalidCharacter));
    }

    #[test]
    fn messages_say_what_to_send_and_never_echo_the_value() {
        let errors = [
            HeaderError::Missing,
            HeaderError::Repeated,
            HeaderError::TooLong {
                max_bytes: MAX_AUTHORIZATION_BYTES,
            },
            HeaderError::WrongScheme,
            HeaderError::MissingKey,
            HeaderError::StrayWhitespace,
            HeaderError::ControlCharacter,
            HeaderError::InvalidCharacter,
        ];
        for error in &errors {
            let message = error.to_string();
            assert!(message.contains("Bearer"), "{message}");
            assert!(!message.contains("mg-v1-"), "{message}");
        }
        for value in [
            format!("Bearer  {KEY}"),
            format!("Bearer {KEY}\n"),
            format!("Basic {KEY}"),
            format!("Bearer {KEY}\"x"),
        ] {
            let error = parse(&value).unwrap_err();
            assert!(!error.to_string().contains(&KEY[6..]), "{error:?}");
            assert!(!format!("{error:?}").contains(&KEY[6..]), "{error:?}");
        }
    }

    /// A valid key: token68, as any bearer token may be.
    fn token68() -> impl Strategy<Value = String> {
        "[A-Za-z0-9._~+/-]{1,60}={0,2}"
    }

    /// `Bearer` in a random ASCII case.
    fn scheme() -> impl Strategy<Value = String> {
        proptest::collection::vec(any::<bool>(), 6).prop_map(|upper| {
            "bearer"
                .chars()
                .zip(upper)
                .map(|(c, up)| if up { c.to_ascii_uppercase() } else { c })
                .collect()
        })
    }

    /// `parse_bearer` as it was first written, a pass per check: the one
    /// pass must answer every value the same.
    fn parse_bearer_by_passes(value: &[u8]) -> Result<&str, HeaderError> {
        if value.len() > MAX_AUTHORIZATION_BYTES {
            return Err(HeaderError::TooLong {
                max_bytes: MAX_AUTHORIZATION_BYTES,
            });
        }
        if value.iter().any(|&byte| is_control(byte)) {
            return Err(HeaderError::ControlCharacter);
        }
        if value.contains(&b'\t') {
            return Err(HeaderError::StrayWhitespace);
        }
        let mut parts = value.split(|&byte| byte == b' ');
        let scheme = parts.next().unwrap_or_default();
        let key = parts.next();
        if parts.next().is_some() || (scheme.is_empty() && key.is_some()) {
            return Err(HeaderError::StrayWhitespace);
        }
        if !scheme.eq_ignore_ascii_case(b"bearer") {
            return Err(HeaderError::WrongScheme);
        }
        let key = match key {
            Some(key) if !key.is_empty() => key,
            _ => return Err(HeaderError::MissingKey),
        };
        let is_token_char = |byte: &&u8| byte.is_ascii_alphanumeric() || b"-._~+/".contains(byte);
        let body = key.iter().take_while(is_token_char).count();
        if !(body > 0 && key.iter().skip(body).all(|&byte| byte == b'=')) {
            return Err(HeaderError::InvalidCharacter);
        }
        std::str::from_utf8(key).map_err(|_| HeaderError::InvalidCharacter)
    }

    proptest! {
        #[test]
        fn one_pass_answers_as_a_pass_per_check(
            value in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..1100),
                "[Bb ][eE\t ]{0,3}[a-zA-Z \t\r\n=+/~._é-]{0,12}".prop_map(String::into_bytes),
                ("[bB][eE][aA][rR][eE][rR]", "[ \t]{0,2}", "[a-zA-Z0-9 =+/~._\x7f\x00-]{0,20}")
                    .prop_map(|(scheme, gap, key)| format!("{scheme}{gap}{key}").into_bytes()),
            ]
        ) {
            prop_assert_eq!(parse_bearer(&value), parse_bearer_by_passes(&value));
        }

        #[test]
        fn arbitrary_bytes_never_panic(value in proptest::collection::vec(any::<u8>(), 0..1100)) {
            if let Ok(key) = parse_bearer(&value) {
                prop_assert!(!key.is_empty());
                prop_assert!(value.ends_with(key.as_bytes()));
                prop_assert!(key.bytes().all(|byte| byte.is_ascii_graphic()));
            }
        }

        #[test]
        fn header_like_values_never_panic(value in "[Bb ][eE\t ]{0,3}[a-zA-Z \t\r\n=+/é]{0,12}") {
            if let Ok(key) = parse(&value) {
                prop_assert!(value.ends_with(key));
                prop_assert_eq!(value.len(), key.len() + 7);
            }
        }

        #[test]
        fn any_valid_key_parses_with_the_scheme_in_any_case(scheme in scheme(), key in token68()) {
            let value = format!("{scheme} {key}");
            prop_assert_eq!(parse(&value), Ok(key.as_str()));
        }

        #[test]
        fn whitespace_or_a_line_break_inserted_anywhere_is_rejected(
            scheme in scheme(),
            key in token68(),
            at in any::<prop::sample::Index>(),
            inserted in prop::sample::select(vec![" ", "\t", "  ", "\r", "\n", "\r\n"]),
        ) {
            let valid = format!("{scheme} {key}");
            let at = at.index(valid.len() + 1);
            let mut value = valid.clone();
            value.insert_str(at, inserted);
            prop_assert_ne!(&value, &valid);
            let expected = if inserted.contains(['\r', '\n']) {
                HeaderError::ControlCharacter
            } else {
                HeaderError::StrayWhitespace
            };
            prop_assert_eq!(parse(&value), Err(expected));
        }

        #[test]
        fn a_separator_replaced_by_other_whitespace_is_rejected(
            key in token68(),
            separator in prop::sample::select(vec!["\t", "  ", "\r", "\n", "\r\n", " \t"]),
        ) {
            let value = format!("Bearer{separator}{key}");
            prop_assert!(matches!(
                parse(&value),
                Err(HeaderError::StrayWhitespace | HeaderError::ControlCharacter)
            ));
        }

        #[test]
        fn a_key_alone_in_x_api_key_is_the_presented_key(key in token68()) {
            let headers = key_headers(None, &[&key]);
            prop_assert_eq!(presented_key(&headers), Ok(key.as_str()));
        }

        #[test]
        fn both_headers_are_one_key_or_refused(first in token68(), second in token68()) {
            let headers = key_headers(Some(&format!("Bearer {first}")), &[&second]);
            let expected = if first == second {
                Ok(first.as_str())
            } else {
                Err(HeaderError::ConflictingKeys)
            };
            prop_assert_eq!(presented_key(&headers), expected);
        }

        #[test]
        fn whitespace_or_a_line_break_anywhere_in_x_api_key_is_rejected(
            key in token68(),
            at in any::<prop::sample::Index>(),
            inserted in prop::sample::select(vec![" ", "\t", "\r", "\n", "\r\n"]),
        ) {
            let mut value = key.clone();
            value.insert_str(at.index(key.len() + 1), inserted);
            let expected = if inserted.contains(['\r', '\n']) {
                ApiKeyFault::ControlCharacter
            } else {
                ApiKeyFault::Whitespace
            };
            prop_assert_eq!(parse_api_key(value.as_bytes()), Err(expected));
        }

        #[test]
        fn a_bad_x_api_key_is_refused_beside_a_good_bearer(key in token68()) {
            let headers = key_headers(Some(&format!("Bearer {key}")), &[&format!("{key} ")]);
            prop_assert_eq!(
                presented_key(&headers),
                Err(HeaderError::ApiKey(ApiKeyFault::Whitespace))
            );
        }
    }

    /// Headers with `authorization` (when given) and each `x-api-key` value.
    fn key_headers(authorization: Option<&str>, api_keys: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = authorization {
            headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        for value in api_keys {
            headers.append(X_API_KEY, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn x_api_key_alone_once_or_refused() {
        assert_eq!(
            presented_key(&key_headers(None, &[])),
            Err(HeaderError::Missing)
        );
        assert_eq!(presented_key(&key_headers(None, &["abc"])), Ok("abc"));
        assert_eq!(
            presented_key(&key_headers(None, &["abc", "abc"])),
            Err(HeaderError::ApiKey(ApiKeyFault::Repeated))
        );
        assert_eq!(
            presented_key(&key_headers(None, &[""])),
            Err(HeaderError::ApiKey(ApiKeyFault::Empty))
        );
        assert_eq!(
            presented_key(&key_headers(None, &["Bearer abc"])),
            Err(HeaderError::ApiKey(ApiKeyFault::Whitespace))
        );
        assert_eq!(
            presented_key(&key_headers(None, &["abc=d"])),
            Err(HeaderError::ApiKey(ApiKeyFault::InvalidCharacter))
        );
        let long = "a".repeat(MAX_AUTHORIZATION_BYTES + 1);
        assert_eq!(
            presented_key(&key_headers(None, &[&long])),
            Err(HeaderError::ApiKey(ApiKeyFault::TooLong {
                max_bytes: MAX_AUTHORIZATION_BYTES
            }))
        );
        assert_eq!(
            parse_api_key(b"abc\x7f"),
            Err(ApiKeyFault::ControlCharacter)
        );
        assert_eq!(
            parse_api_key("\u{e9}".as_bytes()),
            Err(ApiKeyFault::InvalidCharacter)
        );
    }

    #[test]
    fn a_fault_in_either_header_is_reported_whatever_the_other_holds() {
        // A bad Authorization beside a good x-api-key: the Authorization's fault.
        assert_eq!(
            presented_key(&key_headers(Some("Basic abc"), &["abc"])),
            Err(HeaderError::WrongScheme)
        );
        assert_eq!(
            presented_key(&key_headers(Some("Bearer abc"), &["abc", "abc"])),
            Err(HeaderError::ApiKey(ApiKeyFault::Repeated))
        );
        assert_eq!(
            presented_key(&key_headers(Some("Bearer abc"), &["abc"])),
            Ok("abc")
        );
        assert_eq!(
            presented_key(&key_headers(Some("Bearer abc"), &["abd"])),
            Err(HeaderError::ConflictingKeys)
        );
    }

    #[test]
    fn x_api_key_messages_name_their_header_and_differ() {
        let faults = [
            ApiKeyFault::Repeated,
            ApiKeyFault::TooLong { max_bytes: 1024 },
            ApiKeyFault::ControlCharacter,
            ApiKeyFault::Whitespace,
            ApiKeyFault::Empty,
            ApiKeyFault::InvalidCharacter,
        ];
        let messages: std::collections::HashSet<String> = faults
            .iter()
            .map(|fault| HeaderError::ApiKey(*fault).to_string())
            .collect();
        assert_eq!(messages.len(), faults.len());
        assert!(messages.iter().all(|message| message.contains("x-api-key")));
        assert!(
            HeaderError::ConflictingKeys
                .to_string()
                .contains("two different keys")
        );
        assert!(HeaderError::Missing.to_string().contains("x-api-key"));
    }
}
