//! The calling app, from `HTTP-Referer` (its address) and
//! `X-Gateway-Title` or the older `X-Title` (its name).

#[cfg(feature = "apps")]
use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName};

use crate::error::GatewayError;
#[cfg(feature = "apps")]
use crate::json_input::bad_request;

/// The header naming the app's address.
pub const REFERER_HEADER: HeaderName = HeaderName::from_static("http-referer");
/// The header naming the app.
pub const TITLE_HEADER: HeaderName = HeaderName::from_static("x-gateway-title");
/// The older spelling of [`TITLE_HEADER`], read when it is absent.
pub const LEGACY_TITLE_HEADER: HeaderName = HeaderName::from_static("x-title");

/// The longest `HTTP-Referer`, in bytes.
pub const MAX_REFERER_BYTES: usize = 2_048;
/// The longest app title, in characters (and four times that in bytes).
pub const MAX_TITLE_CHARS: usize = 100;

/// The app a request came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct App {
    /// What the ranking groups by: the address's host (with its port when
    /// one is named) and path, without query or fragment, as
    /// `example.com/chat`; or `title:` and the title, for an app on a local
    /// address or with no address.
    pub id: String,
    /// The address, without query or fragment (they may carry secrets);
    /// never a local one.
    pub url: Option<String>,
    /// The app's name, trimmed.
    pub title: Option<String>,
}

/// The app `headers` name, or `None` when they name none (no header, or
/// only a local address without a title: such an app is not ranked).
/// A header that is there but not well-formed is a 400 naming it.
#[cfg(feature = "apps")]
pub fn app_from_headers(headers: &HeaderMap) -> Result<Option<App>, GatewayError> {
    let referer = single(headers, &REFERER_HEADER)?
        .map(|value| parse_referer(value).map_err(|why| bad_header(&REFERER_HEADER, why)))
        .transpose()?;
    let title_header = if headers.contains_key(&TITLE_HEADER) {
        &TITLE_HEADER
    } else {
        &LEGACY_TITLE_HEADER
    };
    let title = single(headers, title_header)?
        .map(|value| parse_title(value).map_err(|why| bad_header(title_header, why)))
        .transpose()?;
    Ok(app(referer, title))
}

/// Without the `apps` feature no request names an app: the headers are
/// not read.
#[cfg(not(feature = "apps"))]
pub fn app_from_headers(_headers: &HeaderMap) -> Result<Option<App>, GatewayError> {
    Ok(None)
}

/// The app a parsed address and title make.
#[cfg(feature = "apps")]
fn app(referer: Option<Referer>, title: Option<String>) -> Option<App> {
    match (referer, title) {
        (Some(referer), title) if !referer.local => Some(App {
            id: referer.id,
            url: Some(referer.url),
            title,
        }),
        (_, Some(title)) => Some(App {
            id: format!("title:{title}"),
            url: None,
            title: Some(title),
        }),
        _ => None,
    }
}

#[cfg(feature = "apps")]
/// The header's one value as bytes, `None` when absent; twice is a 400.
fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<Option<&'a [u8]>, GatewayError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(bad_header(name, "it may be sent once"));
    }
    Ok(first.map(|value| value.as_bytes()))
}

#[cfg(feature = "apps")]
fn bad_header(name: &HeaderName, why: &str) -> GatewayError {
    bad_request(
        name.as_str(),
        format!("the {name} header is not valid: {why}"),
    )
    .with_metadata("reason", "invalid_app_header")
}

#[cfg(feature = "apps")]
/// A parsed `HTTP-Referer`.
#[derive(Debug, PartialEq, Eq)]
struct Referer {
    id: String,
    url: String,
    local: bool,
}

#[cfg(feature = "apps")]
fn parse_referer(value: &[u8]) -> Result<Referer, &'static str> {
    if value.len() > MAX_REFERER_BYTES {
        return Err("it is longer than 2048 bytes");
    }
    let text = std::str::from_utf8(value)
        .ok()
        .filter(|text| text.bytes().all(|byte| byte.is_ascii_graphic()))
        .ok_or("it must be a URL of visible ASCII characters")?;
    let mut url = url::Url::parse(text).map_err(|_| "it must be an absolute http or https URL")?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("it must be an absolute http or https URL");
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("it must not carry a user name or password");
    }
    let Some(host) = url.host_str().map(str::to_ascii_lowercase) else {
        return Err("it must name a host");
    };
    url.set_query(None);
    url.set_fragment(None);
    // Percent-encoding may lengthen it: the bound holds for what is kept.
    if url.as_str().len() > MAX_REFERER_BYTES {
        return Err("it is longer than 2048 bytes once percent-encoded");
    }
    let path = url.path().trim_end_matches('/');
    let mut id = host.clone();
    if let Some(port) = url.port() {
        id.push(':');
        id.push_str(&port.to_string());
    }
    id.push_str(path);
    Ok(Referer {
        local: is_local(&host),
        id,
        url: url.to_string(),
    })
}

#[cfg(feature = "apps")]
/// Whether `host` is this machine or a private network: an app there has
/// no public address to rank.
fn is_local(host: &str) -> bool {
    if host == "localhost" || host.ends_with(".localhost") || host.ends_with(".local") {
        return true;
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => {
            ip.is_loopback()
                || ip.is_private()
                || ip.is_link_local()
                || ip.is_unspecified()
                || ip.is_broadcast()
        }
        Ok(IpAddr::V6(ip)) => {
            ip.is_loopback()
                || ip.is_unspecified()
                // Unique local (fc00::/7) and link-local (fe80::/10).
                || (ip.segments()[0] & 0xfe00) == 0xfc00
                || (ip.segments()[0] & 0xffc0) == 0xfe80
                || ip
                    .to_ipv4_mapped()
                    .is_some_and(|v4| is_local(&v4.to_string()))
        }
        Err(_) => false,
    }
}

#[cfg(feature = "apps")]
fn parse_title(value: &[u8]) -> Result<String, &'static str> {
    if value.len() > MAX_TITLE_CHARS * 4 {
        return Err("it is longer than 100 characters");
    }
    let text = std::str::from_utf8(value).map_err(|_| "it must be UTF-8 text")?;
    if text.chars().any(char::is_control) {
        return Err("it must not contain control characters");
    }
    let title = text.trim();
    if title.is_empty() {
        return Err("it must not be empty");
    }
    if title.chars().count() > MAX_TITLE_CHARS {
        return Err("it is longer than 100 characters");
    }
    Ok(title.to_owned())
}

#[cfg(all(test, feature = "apps"))]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn headers(pairs: &[(&HeaderName, &[u8])]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_bytes(value).unwrap());
        }
        headers
    }

    fn parsed(pairs: &[(&HeaderName, &[u8])]) -> Result<Option<App>, String> {
        app_from_headers(&headers(pairs)).map_err(|error| error.message().to_owned())
    }

    #[test]
    fn a_public_address_names_the_app_without_query_or_fragment() {
        let app = parsed(&[
            (
                &REFERER_HEADER,
                b"https://Chat.Example.com:8443/app/?token=secret#x",
            ),
            (&TITLE_HEADER, b"  Example Chat "),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(app.id, "chat.example.com:8443/app");
        assert_eq!(
            app.url.as_deref(),
            Some("https://chat.example.com:8443/app/")
        );
        assert_eq!(app.title.as_deref(), Some("Example Chat"));
        let bare = parsed(&[(&REFERER_HEADER, b"https://example.com")])
            .unwrap()
            .unwrap();
        assert_eq!((bare.id.as_str(), bare.title), ("example.com", None));
    }

    #[test]
    fn a_local_app_is_ranked_only_under_a_title() {
        for local in [
            "http://localhost:3000/",
            "http://app.localhost",
            "http://127.0.0.1:8080/x",
            "http://[::1]:3000",
            "http://192.168.1.20",
            "http://10.0.0.1",
            "http://printer.local",
            "http://[fd00::1]",
            "http://[::ffff:127.0.0.1]",
        ] {
            assert_eq!(
                parsed(&[(&REFERER_HEADER, local.as_bytes())]).unwrap(),
                None,
                "{local}"
            );
            let titled = parsed(&[
                (&REFERER_HEADER, local.as_bytes()),
                (&LEGACY_TITLE_HEADER, b"My Tool"),
            ])
            .unwrap()
            .unwrap();
            assert_eq!(titled.id, "title:My Tool");
            assert_eq!(titled.url, None, "a local address is never shown");
        }
    }

    #[test]
    fn the_new_title_header_wins_over_the_old_one() {
        let app = parsed(&[(&TITLE_HEADER, b"New"), (&LEGACY_TITLE_HEADER, b"Old")])
            .unwrap()
            .unwrap();
        assert_eq!(app.title.as_deref(), Some("New"));
        assert_eq!(parsed(&[]).unwrap(), None);
        let unicode = parsed(&[(&TITLE_HEADER, "Café ☕".as_bytes())])
            .unwrap()
            .unwrap();
        assert_eq!(unicode.title.as_deref(), Some("Café ☕"));
    }

    #[test]
    fn bad_headers_are_refused_naming_the_header() {
        let long_url = format!("https://example.com/{}", "a".repeat(MAX_REFERER_BYTES));
        let encoded_long = format!("https://example.com/{}", "<".repeat(1000));
        let long_title = "t".repeat(MAX_TITLE_CHARS + 1);
        for (name, value, words) in [
            (&REFERER_HEADER, "example.com", "absolute http or https URL"),
            (
                &REFERER_HEADER,
                "javascript:alert(1)",
                "absolute http or https URL",
            ),
            (
                &REFERER_HEADER,
                "ftp://example.com",
                "absolute http or https URL",
            ),
            (
                &REFERER_HEADER,
                "https://user:pw@example.com",
                "user name or password",
            ),
            (&REFERER_HEADER, long_url.as_str(), "2048 bytes"),
            (
                &REFERER_HEADER,
                encoded_long.as_str(),
                "once percent-encoded",
            ),
            (&TITLE_HEADER, "   ", "empty"),
            (&TITLE_HEADER, "a\tb", "control characters"),
            (&LEGACY_TITLE_HEADER, long_title.as_str(), "100 characters"),
        ] {
            let error = parsed(&[(name, value.as_bytes())]).unwrap_err();
            assert!(
                error.contains(name.as_str()) && error.contains(words),
                "{value}: {error}"
            );
        }
        let not_utf8 = parsed(&[(&TITLE_HEADER, b"\xff\xfe")]).unwrap_err();
        assert!(not_utf8.contains("UTF-8"), "{not_utf8}");
        let twice = parsed(&[(&TITLE_HEADER, b"a"), (&TITLE_HEADER, b"b")]).unwrap_err();
        assert!(twice.contains("once"), "{twice}");
    }

    proptest! {
        #[test]
        fn any_header_bytes_give_an_answer_never_a_panic(
            referer in proptest::collection::vec(any::<u8>(), 0..300),
            title in proptest::collection::vec(any::<u8>(), 0..500),
        ) {
            let (referer_header, title_header) = (REFERER_HEADER, TITLE_HEADER);
            let mut pairs: Vec<(&HeaderName, &[u8])> = Vec::new();
            if HeaderValue::from_bytes(&referer).is_ok() {
                pairs.push((&referer_header, &referer));
            }
            if HeaderValue::from_bytes(&title).is_ok() {
                pairs.push((&title_header, &title));
            }
            if let Ok(Some(app)) = app_from_headers(&headers(&pairs)) {
                // What is kept is bounded and never holds a query.
                prop_assert!(app.id.len() <= MAX_REFERER_BYTES + 6 + MAX_TITLE_CHARS * 4);
                prop_assert!(app.url.iter().all(|url| url.len() <= MAX_REFERER_BYTES));
                prop_assert!(app.url.iter().all(|url| !url.contains('?') && !url.contains('#')));
                let titles_bounded = app.title.iter().all(|title| {
                    !title.is_empty() && title.chars().count() <= MAX_TITLE_CHARS
                        && !title.chars().any(char::is_control)
                });
                prop_assert!(titles_bounded);
                let no_separator = !app.id.contains(char::from(0x1f));
                prop_assert!(no_separator);
            }
        }

        #[test]
        fn public_urls_keep_their_host_and_path(
            host in "[a-z][a-z0-9]{0,20}\\.(com|org|dev)",
            path in "(/[a-z0-9]{1,10}){0,3}",
            query in "[a-z0-9=&]{0,20}",
        ) {
            let referer = format!("https://{host}{path}?{query}");
            let app = parsed(&[(&REFERER_HEADER, referer.as_bytes())]).unwrap().unwrap();
            prop_assert_eq!(app.id, format!("{host}{path}"));
        }
    }
}
