//! Which path is which endpoint: a request's path read as an upstream that
//! normalises paths would read it, the route checks every layer makes on
//! it, and the paths of the JSON API.
//!
//! Every route check in the crate reads the path through
//! [`normalized_segments`] (percent-decoded, empty and `.` segments
//! dropped, `..` applied, fixed segments compared in any ASCII case), so no
//! spelling of a path routes around a check: `/api/v1//Chat/./completions`
//! and `/api/v1/chat/completions` are one endpoint to every layer.

use std::borrow::Cow;

use http::Method;
use http::request::Parts;

/// Names each path of the JSON API once, as a constant its route in the
/// table uses, and gathers them into [`API_PATHS`].
macro_rules! api_paths {
    ($($(#[$attribute:meta])* $name:ident = $path:literal;)*) => {
        /// The patterns of the JSON API's routes (`KeyRoutes`' table names
        /// its paths from here): `{name}` takes one segment.
        pub(crate) mod api_path {
            $(
                $(#[$attribute])*
                #[doc = concat!("`", $path, "`")]
                pub(crate) const $name: &str = $path;
            )*
        }

        /// Every path of the JSON API: the only ones BearerAuth lets a
        /// management key use. The route table (above BearerAuth, since its
        /// handlers take a `Principal`) takes its paths from [`api_path`].
        pub(crate) const API_PATHS: &[&str] = &[$($(#[$attribute])* api_path::$name,)*];

        /// How many segments each of [`API_PATHS`] has, in the same order.
        const API_PATH_DEPTHS: &[usize] =
            &[$($(#[$attribute])* segment_count(api_path::$name),)*];
    };
}

api_paths! {
    KEY = "/api/v1/key";
    CREDITS = "/api/v1/credits";
    USER_BALANCE = "/user/balance";
    GENERATION = "/api/v1/generation";
    GENERATIONS = "/api/v1/generations";
    ACTIVITY = "/api/v1/activity";
    APPS = "/api/v1/apps";
    KEYS = "/api/v1/keys";
    KEYS_HASH = "/api/v1/keys/{hash}";
    KEYS_HASH_LEAKED = "/api/v1/keys/{hash}/leaked";
    KEYS_HASH_ROTATE = "/api/v1/keys/{hash}/rotate";
    #[cfg(feature = "oauth")]
    AUTH_KEYS_CODE = "/api/v1/auth/keys/code";
    ACCOUNTS = "/api/v1/accounts";
    ACCOUNTS_ID = "/api/v1/accounts/{id}";
    ACCOUNTS_ID_CREDITS = "/api/v1/accounts/{id}/credits";
    ACCOUNTS_ID_BYOK = "/api/v1/accounts/{id}/byok";
    ACCOUNTS_ID_BYOK_PROVIDER = "/api/v1/accounts/{id}/byok/{provider}";
}

/// Whether `path` is one of [`API_PATHS`].
pub(crate) fn is_api_path(path: &str) -> bool {
    api_pattern(&normalized_segments(path)).is_some()
}

/// The pattern of [`API_PATHS`] that `segments` match, if any: only those
/// of their depth are tried (a path is logged by this on every request).
fn api_pattern(segments: &[Cow<'_, str>]) -> Option<&'static str> {
    API_PATHS
        .iter()
        .zip(API_PATH_DEPTHS)
        .find(|&(pattern, &depth)| {
            depth == segments.len() && pattern_params(pattern, segments).is_some()
        })
        .map(|(pattern, _)| *pattern)
}

/// How many hex digits of a key hash a log shows.
#[cfg(feature = "proxy")]
const LOGGED_HASH_DIGITS: usize = 8;

/// A run of this many hex digits or more is logged as if it were a hash.
#[cfg(feature = "proxy")]
const MIN_HASH_LIKE_DIGITS: usize = 16;

/// `path` as the access log shows it: normalised as the routes read it,
/// a JSON API path as its route's pattern with the key hash cut to its
/// first 8 hex digits (`/api/v1/keys/1a2b3c4d…/rotate`), and any other
/// run of 16 hex digits or more cut the same way: a log line never carries
/// a whole key hash (the operator key's hash is a path of the API like any
/// other). A service that logs request paths itself logs this.
///
/// ```
/// use modelgate::proxy::loggable_path;
///
/// let hash = "9f".repeat(32);
/// assert_eq!(
///     loggable_path(&format!("/api/v1/keys/{hash}/rotate")),
///     "/api/v1/keys/9f9f9f9f…/rotate"
/// );
/// ```
#[cfg(feature = "proxy")]
pub fn loggable_path(path: &str) -> String {
    let segments = normalized_segments(path);
    let mut logged = String::with_capacity(path.len().min(256));
    let pattern = api_pattern(&segments);
    let mut push = |segment: &str| {
        logged.push('/');
        // Each run of hex digits long enough to be a hash, cut. Scanned by
        // bytes: hex digits are ASCII, so every cut is a char boundary.
        let bytes = segment.as_bytes();
        let (mut kept_to, mut at) = (0, 0);
        while at < bytes.len() {
            if !bytes[at].is_ascii_hexdigit() {
                at += 1;
                continue;
            }
            let run_start = at;
            while at < bytes.len() && bytes[at].is_ascii_hexdigit() {
                at += 1;
            }
            if at - run_start >= MIN_HASH_LIKE_DIGITS {
                logged.push_str(&segment[kept_to..run_start]);
                // Lowercase, as every log shows a hash prefix.
                let prefix = &bytes[run_start..run_start + LOGGED_HASH_DIGITS];
                logged.extend(prefix.iter().map(|b| char::from(b.to_ascii_lowercase())));
                logged.push('…');
                kept_to = at;
            }
        }
        logged.push_str(&segment[kept_to..]);
    };
    match pattern {
        // The route's own spelling, its parameters as sent but for a hash.
        Some(pattern) => {
            let parts = split_at_slashes(pattern).filter(|part| !part.is_empty());
            for (part, segment) in parts.zip(&segments) {
                if part.starts_with('{') {
                    push(segment);
                } else {
                    push(part);
                }
            }
        }
        None => segments.iter().for_each(|segment| push(segment)),
    }
    if logged.is_empty() {
        logged.push('/');
    }
    logged
}

/// Whether `parts` is a chat-completions call: a POST whose path, read as
/// an upstream that normalises paths would read it (percent-decoded, any
/// case, empty and `.` segments dropped, `..` applied), ends in
/// `chat/completions`. So no spelling of the path slips past parsing.
pub(crate) fn is_chat_completions(parts: &Parts) -> bool {
    is_chat_completions_call(&parts.method, parts.uri.path())
}

/// [`is_chat_completions`] on a method and path.
pub(crate) fn is_chat_completions_call(method: &Method, path: &str) -> bool {
    if method != Method::POST {
        return false;
    }
    let is_chat = |chat: &[u8], completions: &[u8]| {
        chat.eq_ignore_ascii_case(b"chat") && completions.eq_ignore_ascii_case(b"completions")
    };
    if let Some(mut segments) = plain_segments(path) {
        return match (segments.next_back(), segments.next_back()) {
            (Some(completions), Some(chat)) => is_chat(chat, completions),
            _ => false,
        };
    }
    matches!(
        normalized_segments(path).as_slice(),
        [.., chat, completions] if is_chat(chat.as_bytes(), completions.as_bytes())
    )
}

/// Whether `path` is one of the Messages API's (`…/messages`,
/// `…/messages/count_tokens`), read as [`is_chat_completions`] reads one:
/// its clients read errors in Anthropic's shape.
pub(crate) fn is_messages_path(path: &str) -> bool {
    let is_messages = |last: Option<&[u8]>, before: Option<&[u8]>| match (last, before) {
        (Some(last), _) if last.eq_ignore_ascii_case(b"messages") => true,
        (Some(last), Some(before)) => {
            last.eq_ignore_ascii_case(b"count_tokens") && before.eq_ignore_ascii_case(b"messages")
        }
        _ => false,
    };
    if let Some(mut segments) = plain_segments(path) {
        let last = segments.next_back();
        return is_messages(last, segments.next_back());
    }
    let segments = normalized_segments(path);
    let mut from_end = segments.iter().rev().map(|segment| segment.as_bytes());
    let last = from_end.next();
    is_messages(last, from_end.next())
}

/// Which Messages API call a request is: a POST whose path
/// [`is_messages_path`], the model call or its `count_tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MessagesCall {
    /// `…/messages`
    Create,
    /// `…/messages/count_tokens`
    CountTokens,
}

/// The Messages API call `method` and `path` make, if any (read as
/// [`is_messages_path`] reads the path).
pub(crate) fn messages_call(method: &Method, path: &str) -> Option<MessagesCall> {
    if method != Method::POST || !is_messages_path(path) {
        return None;
    }
    let last_is_count = match plain_segments(path) {
        Some(mut segments) => segments
            .next_back()
            .is_some_and(|last| last.eq_ignore_ascii_case(b"count_tokens")),
        None => normalized_segments(path)
            .last()
            .is_some_and(|last| last.eq_ignore_ascii_case("count_tokens")),
    };
    Some(match last_is_count {
        true => MessagesCall::CountTokens,
        false => MessagesCall::Create,
    })
}

/// Whether `method` and `path` call a model: chat completions, the
/// Messages API (either call), the Responses API or embeddings.
pub(crate) fn is_model_call(method: &Method, path: &str) -> bool {
    is_chat_completions_call(method, path)
        || messages_call(method, path).is_some()
        || is_responses_call(method, path)
        || is_embeddings_call(method, path)
}

/// Whether `method` and `path` are a Responses API call: a POST whose path
/// (read as [`is_chat_completions`] reads one) ends in `responses`.
pub(crate) fn is_responses_call(method: &Method, path: &str) -> bool {
    method == Method::POST && last_segment_is(path, "responses")
}

/// Whether `method` and `path` are an embeddings call: a POST whose path
/// ends in `embeddings`.
pub(crate) fn is_embeddings_call(method: &Method, path: &str) -> bool {
    method == Method::POST && last_segment_is(path, "embeddings")
}

/// Whether `path`'s last segment, read as an upstream that normalises
/// paths reads it, is `name` in any case.
fn last_segment_is(path: &str, name: &str) -> bool {
    match plain_segments(path) {
        Some(mut segments) => segments
            .next_back()
            .is_some_and(|last| last.eq_ignore_ascii_case(name.as_bytes())),
        None => normalized_segments(path)
            .last()
            .is_some_and(|last| last.eq_ignore_ascii_case(name)),
    }
}

/// The segments of a path that normalising would not change but for its
/// empty segments (nothing to decode, no `.` or `..`), borrowed without
/// gathering them: the usual path, read several times a request.
fn plain_segments(path: &str) -> Option<impl DoubleEndedIterator<Item = &[u8]>> {
    // One pass over a short path: a `%`, or a dot segment (a `.` starting
    // the path or following a slash), is for normalizing.
    let mut previous = b'/';
    for &byte in path.as_bytes() {
        if byte == b'%' || (byte == b'.' && previous == b'/') {
            return None;
        }
        previous = byte;
    }
    // Split by bytes: segments are only compared, in ASCII case.
    let segments = path.as_bytes().split(|&byte| byte == b'/');
    Some(segments.filter(|segment| !segment.is_empty()))
}

/// `path` split at each `/` as `split('/')` splits it, read byte by byte:
/// a route's path is short, `split('/')` starts a `memchr` search for
/// each segment, and a `char` pattern decodes every char.
fn split_at_slashes(path: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(path);
    std::iter::from_fn(move || {
        let text = rest?;
        match text.bytes().position(|byte| byte == b'/') {
            Some(slash) => {
                // Next to an ASCII `/`: both cuts are char boundaries.
                rest = text.get(slash + 1..);
                text.get(..slash)
            }
            None => {
                rest = None;
                Some(text)
            }
        }
    })
}

/// A path's [normalized segments](normalized_segments): up to 8 without
/// an allocation, as every route's are.
pub(crate) type Segments<'text> = smallvec::SmallVec<[Cow<'text, str>; 8]>;

/// The segments of `path` as an upstream that normalises paths reads them:
/// percent-decoded, empty and `.` segments dropped, `..` applied. Every
/// route check in the crate matches on these, so no spelling of a path
/// routes around a check. Every request's path is read this way several
/// times, so a path with nothing to decode is only borrowed.
pub(crate) fn normalized_segments(path: &str) -> Segments<'_> {
    // Nothing to decode (the usual case): the path is already text.
    if memchr::memchr(b'%', path.as_bytes()).is_none() {
        return normalize_segments(path, Cow::Borrowed);
    }
    match percent_encoding::percent_decode_str(path).decode_utf8_lossy() {
        Cow::Borrowed(text) => normalize_segments(text, Cow::Borrowed),
        Cow::Owned(text) => normalize_segments(&text, |segment| Cow::Owned(segment.to_owned())),
    }
}

/// Whether `path`'s [normalized segments](normalized_segments) are
/// `expected`, in any case.
pub(crate) fn path_is(path: &str, expected: &[&str]) -> bool {
    if let Some(same) = canonical_path_is(path.as_bytes(), expected) {
        return same;
    }
    let same = |segment: &[u8], expected: &&str| segment.eq_ignore_ascii_case(expected.as_bytes());
    if let Some(mut segments) = plain_segments(path) {
        let mut expected = expected.iter();
        return loop {
            match (segments.next(), expected.next()) {
                (Some(segment), Some(want)) if same(segment, want) => continue,
                (None, None) => break true,
                _ => break false,
            }
        };
    }
    let segments = normalized_segments(path);
    segments.len() == expected.len()
        && segments
            .iter()
            .zip(expected)
            .all(|(segment, expected)| same(segment.as_bytes(), expected))
}

/// [`path_is`] decided without reading the path into segments, when it
/// can be: `Some(true)` for the path spelled `/a/b/c` (any case), which
/// normalising leaves as it is (`expected` names plain segments: no `/`,
/// `%` or dot segment); `Some(false)` for any other path spelled so (a
/// leading slash, no empty or dot segment, nothing escaped, no slash at
/// the end); `None` for any other spelling. Most requests' paths are the
/// first or the second, and several layers ask of each.
fn canonical_path_is(path: &[u8], expected: &[&str]) -> Option<bool> {
    debug_assert!(
        expected
            .iter()
            .all(|want| { !matches!(*want, "" | "." | "..") && !want.contains(['/', '%']) }),
        "route segments are plain names: {expected:?}"
    );
    let mut rest = Some(path);
    for want in expected.iter().map(|want| want.as_bytes()) {
        rest = rest
            .and_then(|rest| rest.strip_prefix(b"/"))
            .filter(|after| {
                after.len() >= want.len() && after[..want.len()].eq_ignore_ascii_case(want)
            })
            .map(|after| &after[want.len()..]);
    }
    if rest.is_some_and(<[u8]>::is_empty) {
        return Some(true);
    }
    let mut previous = 0;
    for &byte in path {
        if byte == b'%' || (previous == b'/' && matches!(byte, b'/' | b'.')) {
            return None;
        }
        previous = byte;
    }
    match path.first() == Some(&b'/') && previous != b'/' {
        true => Some(false),
        false => None,
    }
}

/// The parameters of `segments` (a path's [normalized
/// segments](normalized_segments)) when they match `pattern`, a path such
/// as `/api/v1/keys/{hash}`: each `{name}` takes one segment, as it is;
/// every other segment must be the same in any case. `None` when they do
/// not match.
pub(crate) fn pattern_params<'s>(
    pattern: &str,
    segments: &'s [Cow<'_, str>],
) -> Option<Vec<&'s str>> {
    // A path of another depth is no match, found without splitting the
    // pattern: most patterns a path is tried against fail here.
    if segment_count(pattern) != segments.len() {
        return None;
    }
    let mut params = Vec::new();
    let mut pattern_segments = split_at_slashes(pattern).filter(|segment| !segment.is_empty());
    for segment in segments {
        let expected = pattern_segments.next()?;
        if expected.starts_with('{') && expected.ends_with('}') {
            params.push(segment.as_ref());
        } else if !segment.eq_ignore_ascii_case(expected) {
            return None;
        }
    }
    pattern_segments.next().is_none().then_some(params)
}

/// How many non-empty segments `path` has (as `split('/')` without the
/// empty ones counts them).
const fn segment_count(path: &str) -> usize {
    let bytes = path.as_bytes();
    let (mut at, mut previous, mut count) = (0, b'/', 0);
    // A `while`: the API's patterns are counted at compile time.
    while at < bytes.len() {
        if previous == b'/' && bytes[at] != b'/' {
            count += 1;
        }
        previous = bytes[at];
        at += 1;
    }
    count
}

fn normalize_segments<'text, 'out>(
    text: &'text str,
    keep: impl Fn(&'text str) -> Cow<'out, str>,
) -> Segments<'out> {
    let mut segments = Segments::new();
    for segment in split_at_slashes(text) {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            segment => segments.push(keep(segment)),
        }
    }
    segments
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[cfg(feature = "proxy")]
    #[test]
    fn a_logged_path_carries_a_hash_prefix_only() {
        let hash = "0123456789abcdef".repeat(4);
        for (path, logged) in [
            (format!("/api/v1/keys/{hash}"), "/api/v1/keys/01234567…"),
            (
                format!("/API/v1//Keys/./{hash}/rotate"),
                "/api/v1/keys/01234567…/rotate",
            ),
            (
                format!("/api/v1/keys/{hash}/leaked"),
                "/api/v1/keys/01234567…/leaked",
            ),
            (
                format!("/api/v1/keys/{}", "ABCDEF0123456789".repeat(4)),
                "/api/v1/keys/abcdef01…",
            ),
            // Percent-encoded, or on a path no route has.
            (
                format!("/api/v1/keys/%30{}", &hash[1..]),
                "/api/v1/keys/01234567…",
            ),
            (format!("/nowhere/{hash}/x"), "/nowhere/01234567…/x"),
            (format!("/x/key-{hash}.txt"), "/x/key-01234567….txt"),
            ("/x/cafe-0123".to_owned(), "/x/cafe-0123"),
            (
                "/api/v1/chat/completions".to_owned(),
                "/api/v1/chat/completions",
            ),
            (
                "/api/v1/accounts/acme/byok/openai".to_owned(),
                "/api/v1/accounts/acme/byok/openai",
            ),
            ("".to_owned(), "/"),
        ] {
            assert_eq!(loggable_path(&path), logged, "{path}");
        }
    }

    /// The logged path by `find` over chars, as it was first written: the
    /// byte scan must log every path the same.
    #[cfg(feature = "proxy")]
    fn cut_hex_runs_by_chars(segment: &str) -> String {
        let mut logged = String::new();
        let mut rest = segment;
        while !rest.is_empty() {
            let start = rest
                .find(|c: char| c.is_ascii_hexdigit())
                .unwrap_or(rest.len());
            logged.push_str(&rest[..start]);
            rest = &rest[start..];
            let run = rest
                .find(|c: char| !c.is_ascii_hexdigit())
                .unwrap_or(rest.len());
            if run >= MIN_HASH_LIKE_DIGITS {
                logged.push_str(&rest[..LOGGED_HASH_DIGITS].to_ascii_lowercase());
                logged.push('…');
            } else {
                logged.push_str(&rest[..run]);
            }
            rest = &rest[run..];
        }
        logged
    }

    #[cfg(feature = "proxy")]
    proptest! {
        /// A path of no route logs each segment with its hash-like runs cut,
        /// exactly as a scan by chars cuts them.
        #[test]
        fn the_byte_scan_cuts_as_the_char_scan_did(
            segments in proptest::collection::vec("[a-fA-F0-9xé…-]{0,40}", 1..4),
        ) {
            let path = format!("/zz/{}", segments.join("/"));
            let expected: String = std::iter::once("zz")
                .chain(segments.iter().map(String::as_str))
                .filter(|segment| !segment.is_empty())
                .map(|segment| format!("/{}", cut_hex_runs_by_chars(segment)))
                .collect();
            prop_assert_eq!(loggable_path(&path), expected);
        }

        /// No path logs a run of 16 hex digits or more, nor panics.
        #[test]
        fn no_logged_path_carries_a_long_hex_run(path in "(/[a-fA-F0-9%./]{0,70}){0,4}") {
            let logged = loggable_path(&path);
            let mut run = 0;
            for byte in logged.bytes() {
                run = if byte.is_ascii_hexdigit() { run + 1 } else { 0 };
                prop_assert!(run < 16, "{logged}");
            }
        }
    }

    #[test]
    fn a_pattern_matches_its_segments_in_any_case_and_takes_its_parameters_as_sent() {
        let params = |pattern: &str, path: &str| {
            let segments = normalized_segments(path);
            pattern_params(pattern, &segments).map(|params| {
                params
                    .iter()
                    .map(|param| param.to_string())
                    .collect::<Vec<_>>()
            })
        };
        let pattern = "/api/v1/accounts/{id}/byok/{provider}";
        assert_eq!(
            params(pattern, "/API/v1/Accounts/Team-A/byok/OpenAI"),
            Some(vec!["Team-A".to_owned(), "OpenAI".to_owned()])
        );
        assert_eq!(params(pattern, "/api/v1/accounts/a/byok"), None);
        assert_eq!(params(pattern, "/api/v1/accounts/a/byok/b/c"), None);
        assert_eq!(params(pattern, "/api/v1/accounts/a/keys/b"), None);
        assert_eq!(params("/user/balance", "/user/balance/"), Some(vec![]));
        assert_eq!(params("/", "/"), Some(vec![]));
        assert_eq!(params("/user", "/"), None);
    }

    proptest! {
        /// The borrowed reading of a plain path says what the full
        /// normalisation says, for any path: the shortcut changes no route.
        #[test]
        fn route_checks_read_any_path_as_normalising_it_does(
            path in "(/|//|\\.|\\.\\.|%2[eEfF]|%63|chat|CHAT|completions|Completions|api|v1|x|/api/v1/chat|/completions){0,12}",
        ) {
            let segments = normalized_segments(&path);
            let chat = matches!(
                segments.as_slice(),
                [.., chat, completions]
                    if chat.eq_ignore_ascii_case("chat") && completions.eq_ignore_ascii_case("completions")
            );
            prop_assert_eq!(is_chat_completions_call(&Method::POST, &path), chat);
            for expected in [&["api", "v1", "chat", "completions"][..], &["chat"][..], &[][..]] {
                let same = segments.len() == expected.len()
                    && segments.iter().zip(expected).all(|(a, b)| a.eq_ignore_ascii_case(b));
                prop_assert_eq!(path_is(&path, expected), same, "{:?} against {:?}", path, expected);
            }
        }

        #[test]
        fn the_byte_split_is_the_char_split(path in "[a/\u{e9}.%]{0,16}") {
            let bytewise: Vec<&str> = split_at_slashes(&path).collect();
            let charwise: Vec<&str> = path.split('/').collect();
            prop_assert_eq!(bytewise, charwise);
        }

        #[test]
        fn a_segment_count_is_that_of_the_split(path in "[a/]{0,12}") {
            prop_assert_eq!(
                segment_count(&path),
                path.split('/').filter(|segment| !segment.is_empty()).count()
            );
        }

        #[test]
        fn a_pattern_matches_every_path_it_describes(
            parts in proptest::collection::vec(("[a-zA-Z]{1,5}", any::<bool>()), 0..6),
            values in proptest::collection::vec("[a-zA-Z0-9_-]{1,8}", 6),
        ) {
            // Each part a fixed segment or a parameter; the path spells the
            // fixed ones in upper case and puts a value in each parameter.
            let mut pattern = String::new();
            let mut path = String::new();
            let mut expected = Vec::new();
            for (index, (name, is_param)) in parts.iter().enumerate() {
                if *is_param {
                    pattern.push_str(&format!("/{{{name}}}"));
                    path.push_str(&format!("/{}", values[index]));
                    expected.push(values[index].clone());
                } else {
                    pattern.push_str(&format!("/{name}"));
                    path.push_str(&format!("/{}", name.to_ascii_uppercase()));
                }
            }
            let segments = normalized_segments(&path);
            let found = pattern_params(&pattern, &segments)
                .map(|params| params.iter().map(|param| param.to_string()).collect::<Vec<_>>());
            prop_assert_eq!(found, Some(expected));
        }

        #[test]
        fn a_path_without_escapes_reads_as_its_decoding_would(
            path in "[a-zA-Z0-9./%é_-]{0,40}",
        ) {
            // The shortcut for a path with no `%` must split exactly as
            // the full percent-decoding would.
            let decoded = percent_encoding::percent_decode_str(&path).decode_utf8_lossy();
            let expected: Vec<String> =
                normalize_segments(&decoded, Cow::Borrowed).iter().map(|s| s.to_string()).collect();
            let got: Vec<String> = normalized_segments(&path).iter().map(|s| s.to_string()).collect();
            prop_assert_eq!(got, expected);
        }

    }
}
