//! [`ModelId`]: `<provider>/<model>` with an optional `:variant`.

use std::fmt;

use crate::error::GatewayError;
use crate::json_input::bad_request;

/// A model id as seed 000 shapes it: `<provider>/<model>`, optionally
/// followed by `:variant` (`:free` marks a free variant with its own
/// quota).
///
/// The parser is strict, so that no spelling slips past a per-model rule:
/// exactly one `/` and at most one `:`; provider, model and variant non-empty;
/// only ASCII letters, digits, `.`, `-` and `_` (no whitespace anywhere);
/// at most [`ModelId::MAX_LEN`] bytes. Comparisons that decide limits —
/// [`is_free`](Self::is_free), rule matching — ignore ASCII case, since
/// upstreams commonly do.
///
/// ```
/// use modelgate::body::ModelId;
///
/// let id = ModelId::parse("meta-llama/llama-3.1-8b-instruct:free").unwrap();
/// assert_eq!(id.provider(), "meta-llama");
/// assert_eq!(id.model(), "llama-3.1-8b-instruct");
/// assert_eq!(id.variant(), Some("free"));
/// assert!(id.is_free());
/// assert_eq!(ModelId::parse("gpt-4o").unwrap_err().status(), 400);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModelId {
    text: String,
    slash: usize,
    colon: Option<usize>,
}

impl ModelId {
    /// The longest model id accepted, in bytes.
    pub const MAX_LEN: usize = 200;

    /// Parses `text`; a 400 naming what is wrong otherwise.
    pub fn parse(text: &str) -> Result<ModelId, GatewayError> {
        if text.is_empty() {
            return Err(bad_model("`model` must not be empty".to_owned()));
        }
        if text.len() > Self::MAX_LEN {
            return Err(bad_model(format!(
                "`model` is longer than {} characters",
                Self::MAX_LEN
            )));
        }
        if text.chars().any(char::is_whitespace) {
            return Err(bad_model(
                "`model` must not contain spaces, tabs or line breaks".to_owned(),
            ));
        }
        if let Some(bad) = text.chars().find(|c| !is_model_char(*c)) {
            return Err(bad_model(format!(
                "`model` contains {bad:?}; model ids use letters, digits, '.', '-' and '_', with one '/' and an optional ':variant'"
            )));
        }
        let mut slashes = text.match_indices('/').map(|(index, _)| index);
        let (Some(slash), None) = (slashes.next(), slashes.next()) else {
            return Err(bad_model(format!(
                "`model` must look like provider/model, such as \"openai/gpt-4o\", with exactly one '/'; got {text:?}"
            )));
        };
        let mut colons = text.match_indices(':').map(|(index, _)| index);
        let colon = colons.next();
        if colons.next().is_some() || colon.is_some_and(|colon| colon < slash) {
            return Err(bad_model(
                "`model` may have one ':variant', after the model name, such as \"openai/gpt-4o:free\"".to_owned(),
            ));
        }
        let id = ModelId {
            text: text.to_owned(),
            slash,
            colon,
        };
        for (part, value) in [
            ("provider", id.provider()),
            ("model name", id.model()),
            ("variant", id.variant().unwrap_or("x")),
        ] {
            if value.is_empty() {
                return Err(bad_model(format!("`model` has an empty {part}: {text:?}")));
            }
        }
        Ok(id)
    }

    /// The whole id, as sent.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The part before `/`.
    pub fn provider(&self) -> &str {
        &self.text[..self.slash]
    }

    /// The part after `/`, without the variant.
    pub fn model(&self) -> &str {
        &self.text[self.slash + 1..self.colon.unwrap_or(self.text.len())]
    }

    /// `provider/model`, without the variant.
    pub fn base(&self) -> &str {
        &self.text[..self.colon.unwrap_or(self.text.len())]
    }

    /// The part after `:`, if any.
    pub fn variant(&self) -> Option<&str> {
        self.colon.map(|colon| &self.text[colon + 1..])
    }

    /// Whether this is a free variant (`:free`, in any case).
    pub fn is_free(&self) -> bool {
        self.variant()
            .is_some_and(|variant| variant.eq_ignore_ascii_case("free"))
    }
}

impl fmt::Display for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Whether the model pattern `pattern` covers `model`: `provider/` covers
/// every model of the provider, an id with a `:variant` that variant only,
/// an id without one the model in every variant (a rate rule naming
/// `openai/gpt-4o` is not dodged with `:nitro`). ASCII case is ignored.
/// `pattern` is one [`check_pattern`] accepted.
pub(crate) fn pattern_covers(pattern: &str, model: &ModelId) -> bool {
    if let Some(provider) = pattern.strip_suffix('/') {
        return model.provider().eq_ignore_ascii_case(provider);
    }
    if pattern.contains(':') {
        model.as_str().eq_ignore_ascii_case(pattern)
    } else {
        model.base().eq_ignore_ascii_case(pattern)
    }
}

/// Whether an allow-list entry `pattern` lets a key call `model`: a
/// provider prefix (`provider/`) every model of the provider; a model id
/// that exact id only (a variant such as `:online` may cost more or do
/// more, so it is allowed by naming it). Spelled exactly as listed: the
/// request goes upstream as the client spelled it, and an upstream that
/// tells models apart by case must get only what the list names.
pub(crate) fn pattern_allows(pattern: &str, model: &ModelId) -> bool {
    match pattern.strip_suffix('/') {
        Some(provider) => model.provider() == provider,
        None => model.as_str() == pattern,
    }
}

/// The allow-list entry `pattern` would allow `model` spelled in another
/// ASCII case: the spelling to tell a refused client.
pub(crate) fn pattern_allows_in_other_case(pattern: &str, model: &ModelId) -> bool {
    match pattern.strip_suffix('/') {
        Some(provider) => model.provider().eq_ignore_ascii_case(provider),
        None => model.as_str().eq_ignore_ascii_case(pattern),
    }
}

/// Checks a model pattern: a model id (`provider/model[:variant]`) or a
/// provider prefix (`provider/`); what is wrong otherwise.
pub(crate) fn check_pattern(pattern: &str) -> Result<(), String> {
    let valid = match pattern.strip_suffix('/') {
        Some(provider) => ModelId::parse(&format!("{provider}/x")).is_ok(),
        None => ModelId::parse(pattern).is_ok(),
    };
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{pattern:?} is neither a model id (provider/model[:variant]) nor a provider prefix (provider/)"
        ))
    }
}

fn is_model_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/' | ':')
}

fn bad_model(message: String) -> GatewayError {
    bad_request("model", message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_rule_covers_variants_an_allow_list_only_what_it_names() {
        let id = |text| ModelId::parse(text).unwrap();
        for (pattern, model, covers, allows) in [
            ("openai/gpt-4o", "OpenAI/GPT-4o", true, false),
            ("openai/gpt-4o", "openai/gpt-4o", true, true),
            ("openai/gpt-4o", "openai/gpt-4o:online", true, false),
            ("openai/gpt-4o:free", "openai/gpt-4o:FREE", true, false),
            ("openai/gpt-4o:free", "openai/gpt-4o:free", true, true),
            ("openai/gpt-4o:free", "openai/gpt-4o", false, false),
            ("openai/", "OPENAI/o1:beta", true, false),
            ("openai/", "openai/o1:beta", true, true),
            ("openai/", "openaix/o1", false, false),
            ("openai/gpt-4o", "openai/gpt-4o-mini", false, false),
        ] {
            assert_eq!(
                pattern_covers(pattern, &id(model)),
                covers,
                "{pattern} {model}"
            );
            assert_eq!(
                pattern_allows(pattern, &id(model)),
                allows,
                "{pattern} {model}"
            );
        }
        assert!(check_pattern("anthropic/").is_ok() && check_pattern("a/b:c").is_ok());
        for bad in ["/", "a", "a//", "a/b c", "a/b:", ":x/y", ""] {
            assert!(check_pattern(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn real_ids_parse_into_their_parts() {
        for (text, provider, model, variant) in [
            ("openai/gpt-4o", "openai", "gpt-4o", None),
            (
                "anthropic/claude-3.5-sonnet:beta",
                "anthropic",
                "claude-3.5-sonnet",
                Some("beta"),
            ),
            (
                "Qwen/Qwen2.5-72B-Instruct",
                "Qwen",
                "Qwen2.5-72B-Instruct",
                None,
            ),
            (
                "google/gemini_2.0:free",
                "google",
                "gemini_2.0",
                Some("free"),
            ),
        ] {
            let id = ModelId::parse(text).unwrap();
            assert_eq!(
                (id.provider(), id.model(), id.variant()),
                (provider, model, variant)
            );
            assert_eq!(id.as_str(), text);
            assert_eq!(id.to_string(), text);
        }
        assert_eq!(ModelId::parse("a/b:free").unwrap().base(), "a/b");
        assert!(ModelId::parse("a/b:FREE").unwrap().is_free());
        assert!(!ModelId::parse("a/b:freebie").unwrap().is_free());
        assert!(!ModelId::parse("free/free").unwrap().is_free());
    }

    #[test]
    fn each_malformed_id_gets_its_own_400() {
        for (text, words) in [
            ("", "empty"),
            ("gpt-4o", "exactly one '/'"),
            ("a/b/c", "exactly one '/'"),
            ("/gpt", "empty provider"),
            ("openai/", "empty model name"),
            ("openai/:free", "empty model name"),
            ("openai/gpt:", "empty variant"),
            ("openai/gpt:free:x", "one ':variant'"),
            ("open:ai/gpt", "one ':variant'"),
            ("openai/gpt 4o", "spaces"),
            ("openai/gpt-4o\n", "line breaks"),
            ("openai/gpt\u{a0}4o", "spaces"),
            ("openai/gpt*", "'*'"),
            ("openai/gpt%2F4o", "'%'"),
            ("openai/gptö", "'ö'"),
        ] {
            let error = ModelId::parse(text).unwrap_err();
            assert_eq!(error.status(), 400, "{text:?}");
            assert_eq!(error.metadata()["param"], "model");
            assert!(
                error.message().contains(words),
                "{text:?}: {}",
                error.message()
            );
        }
        let long = format!("p/{}", "m".repeat(ModelId::MAX_LEN));
        assert!(
            ModelId::parse(&long)
                .unwrap_err()
                .message()
                .contains("longer")
        );
    }

    proptest! {
        #[test]
        fn any_string_is_a_result_never_a_panic(text in "\\PC{0,40}") {
            let _ = ModelId::parse(&text);
        }

        #[test]
        fn well_formed_ids_round_trip(
            provider in "[A-Za-z0-9._-]{1,20}",
            model in "[A-Za-z0-9._-]{1,40}",
            variant in proptest::option::of("[A-Za-z0-9._-]{1,10}"),
        ) {
            let text = match &variant {
                Some(variant) => format!("{provider}/{model}:{variant}"),
                None => format!("{provider}/{model}"),
            };
            let id = ModelId::parse(&text).unwrap();
            prop_assert_eq!(id.provider(), provider.as_str());
            prop_assert_eq!(id.model(), model.as_str());
            prop_assert_eq!(id.variant(), variant.as_deref());
        }

        #[test]
        fn whitespace_anywhere_is_refused(
            text in "[a-z]{1,8}/[a-z]{1,8}(:free)?",
            at in 0usize..30,
            space in prop_oneof![Just(' '), Just('\t'), Just('\n'), Just('\r'), Just('\u{2003}')],
        ) {
            let mut spaced: Vec<char> = text.chars().collect();
            spaced.insert(at.min(spaced.len()), space);
            let spaced: String = spaced.into_iter().collect();
            prop_assert!(ModelId::parse(&spaced).is_err());
        }

        #[test]
        fn whatever_parses_has_exactly_one_slash_and_safe_characters(text in "[a-z/:.%* -]{0,12}") {
            if let Ok(id) = ModelId::parse(&text) {
                prop_assert_eq!(id.as_str().matches('/').count(), 1);
                prop_assert!(id.as_str().chars().all(is_model_char));
                prop_assert!(!id.provider().is_empty() && !id.model().is_empty());
            }
        }
    }
}
