//! [`ModelId`]: `<provider>/<model>` with an optional `:variant`;
//! [`ModelNames`]: the bare ids and aliases a service accepts for them.

use std::collections::HashMap;
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
        // One pass over the bytes: every one a model char (all ASCII),
        // and where the slashes and colons are.
        let (mut slashes, mut colons) = (Marks::default(), Marks::default());
        for (index, &byte) in text.as_bytes().iter().enumerate() {
            match byte {
                b'/' => slashes.note(index),
                b':' => colons.note(index),
                _ if is_model_char(char::from(byte)) => {}
                // Not a model char: the message names the first.
                _ => return Err(unlike_a_model_id(text)),
            }
        }
        let (Some(slash), 1) = (slashes.first, slashes.count) else {
            return Err(bad_model(format!(
                "`model` must look like provider/model, such as \"openai/gpt-4o\", with exactly one '/'; got {text:?}"
            )));
        };
        let colon = colons.first;
        if colons.count > 1 || colon.is_some_and(|colon| colon < slash) {
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

/// How a service names models on its own terms: bare ids (`gpt-4o-mini`)
/// and aliases (`claude-opus-4-8`) resolved to the [`ModelId`] the gateway
/// prices, limits and records.
///
/// An id with a `/` always means itself and is parsed as [`ModelId::parse`]
/// parses it; only a bare id (no `/`) is resolved, in this order:
///
/// 1. an exact alias: `"claude-opus-4-8"` → `"anthropic/claude-opus-4-8"`;
/// 2. the longest prefix pattern that matches: `"claude-*"` → `"anthropic/"`
///    makes `claude-haiku-4-5` into `anthropic/claude-haiku-4-5`;
/// 3. the default provider: `openai` makes `gpt-4o-mini` into
///    `openai/gpt-4o-mini`;
/// 4. otherwise a 400 naming the aliases the service accepts.
///
/// Matching is exact, ASCII case included (clients send fixed ids). A
/// `:variant` stays part of the bare id: `llama:free` with the default
/// provider `meta` is `meta/llama:free`. Empty (the default), it resolves
/// nothing: every id must be `provider/model`, as without it.
///
/// ```
/// use modelgate::body::ModelNames;
///
/// let names = ModelNames::new()
///     .default_provider("openai").unwrap()
///     .alias("claude-opus-4-8", "anthropic/claude-opus-4-8").unwrap()
///     .alias("claude-*", "anthropic/").unwrap();
/// assert_eq!(names.resolve("claude-opus-4-8").unwrap().as_str(), "anthropic/claude-opus-4-8");
/// assert_eq!(names.resolve("claude-haiku-4-5").unwrap().as_str(), "anthropic/claude-haiku-4-5");
/// assert_eq!(names.resolve("gpt-5.5").unwrap().as_str(), "openai/gpt-5.5");
/// assert_eq!(names.resolve("mistral/small").unwrap().as_str(), "mistral/small");
/// assert_eq!(ModelNames::new().resolve("gpt-5.5").unwrap_err().status(), 400);
/// assert!(ModelNames::new().alias("gpt-*", "openai/gpt-4o").is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelNames {
    default_provider: Option<String>,
    exact: HashMap<String, ModelId>,
    /// `(prefix, provider)`, longest prefix first.
    patterns: Vec<(String, String)>,
}

/// A [`ModelNames`] setting that cannot be used, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelNamesError(String);

impl fmt::Display for ModelNamesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ModelNamesError {}

/// How many alias names a refusal lists before "…".
const ALIASES_NAMED: usize = 5;

impl ModelNames {
    /// No bare ids, no aliases: every id must be `provider/model`.
    pub fn new() -> Self {
        ModelNames::default()
    }

    /// Whether it resolves nothing (ids are taken as [`ModelId::parse`] takes them).
    pub fn is_empty(&self) -> bool {
        self.default_provider.is_none() && self.exact.is_empty() && self.patterns.is_empty()
    }

    /// A bare id no alias names becomes `<provider>/<id>`. `provider` is a
    /// provider name as in a model id (letters, digits, `.`, `-`, `_`).
    pub fn default_provider(mut self, provider: &str) -> Result<Self, ModelNamesError> {
        if provider.contains('/') || ModelId::parse(&format!("{provider}/x")).is_err() {
            return Err(ModelNamesError(format!(
                "default_provider: {provider:?} is not a provider name: use letters, digits, '.', '-' and '_', without '/' or ':'"
            )));
        }
        self.default_provider = Some(provider.to_owned());
        Ok(self)
    }

    /// An alias: `name` a bare id and `target` a model id
    /// (`"gpt-5.5"`, `"openai/gpt-5.5"`), or `name` a prefix pattern ending
    /// in `*` and `target` a provider prefix (`"claude-*"`, `"anthropic/"`),
    /// the bare id then appended to it. A `name` set twice takes the later
    /// `target`.
    pub fn alias(mut self, name: &str, target: &str) -> Result<Self, ModelNamesError> {
        let error = |why: String| Err(ModelNamesError(format!("model_aliases[{name:?}]: {why}")));
        if let Some(prefix) = name.strip_suffix('*') {
            if prefix.is_empty() {
                return error(
                    "a pattern needs a prefix before '*' (to map every bare id, set default_provider)"
                        .to_owned(),
                );
            }
            if let Some(bad) = prefix.chars().find(|c| !is_bare_char(*c)) {
                return error(format!(
                    "a pattern is a prefix and one trailing '*'; {bad:?} may not appear in it (letters, digits, '.', '-', '_', ':')"
                ));
            }
            let Some(provider) = target.strip_suffix('/') else {
                return error(format!(
                    "a pattern maps to a provider prefix such as \"anthropic/\", not {target:?}"
                ));
            };
            if provider.contains('/') || ModelId::parse(&format!("{provider}/x")).is_err() {
                return error(format!("{target:?} is not a provider prefix (provider/)"));
            }
            self.patterns.retain(|(known, _)| known != prefix);
            self.patterns.push((prefix.to_owned(), provider.to_owned()));
            // Longest first; equal lengths by text, so the order is fixed.
            self.patterns
                .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
            return Ok(self);
        }
        if name.is_empty() || name.len() > ModelId::MAX_LEN {
            return error(format!(
                "an alias is 1 to {} characters long",
                ModelId::MAX_LEN
            ));
        }
        if let Some(bad) = name.chars().find(|c| !is_bare_char(*c)) {
            return error(format!(
                "an alias is a bare model id (letters, digits, '.', '-', '_', ':'; an id with '/' always means itself, and '*' only ends a pattern); it contains {bad:?}"
            ));
        }
        let target = ModelId::parse(target).map_err(|problem| {
            ModelNamesError(format!(
                "model_aliases[{name:?}]: {target:?} is not a model id (provider/model[:variant]): {}",
                problem.message()
            ))
        })?;
        self.exact.insert(name.to_owned(), target);
        Ok(self)
    }

    /// The model `model` names: see [`ModelNames`] for the order. A 400
    /// naming `model` when it names none; with no names set, exactly
    /// [`ModelId::parse`]'s answer.
    pub fn resolve(&self, model: &str) -> Result<ModelId, GatewayError> {
        if self.is_empty() || model.contains('/') {
            return ModelId::parse(model);
        }
        if let Some(target) = self.exact.get(model) {
            return Ok(target.clone());
        }
        let provider = self
            .patterns
            .iter()
            .find(|(prefix, _)| model.starts_with(prefix.as_str()))
            .map(|(_, provider)| provider)
            .or(self.default_provider.as_ref());
        match provider {
            Some(provider) => ModelId::parse(&format!("{provider}/{model}")),
            None => Err(bad_model(format!(
                "`model` must look like provider/model, such as \"openai/gpt-4o\", or be one of the model aliases this service accepts ({}); got {model:?}",
                self.alias_names()
            ))),
        }
    }

    /// The bare ids that resolve to `model`: the aliases naming it, and
    /// its own bare form when a pattern or the default provider takes it
    /// there. Sorted.
    pub fn names_for(&self, model: &ModelId) -> Vec<String> {
        let mut names: Vec<String> = self
            .exact
            .iter()
            .filter(|(_, target)| *target == model)
            .map(|(name, _)| name.clone())
            .collect();
        let bare = &model.as_str()[model.provider().len() + 1..];
        if !self.exact.contains_key(bare)
            && self.resolve(bare).is_ok_and(|resolved| resolved == *model)
        {
            names.push(bare.to_owned());
        }
        names.sort();
        names
    }

    /// The configured names for a refusal: the first few, patterns with their `*`.
    fn alias_names(&self) -> String {
        let mut names: Vec<String> = self.exact.keys().cloned().collect();
        names.sort();
        names.extend(self.patterns.iter().map(|(prefix, _)| format!("{prefix}*")));
        let more = names.len() > ALIASES_NAMED;
        names.truncate(ALIASES_NAMED);
        let mut listed = names.join(", ");
        if more {
            listed.push_str(", …");
        }
        listed
    }
}

/// A character of a bare id: a model id's, without the `/`.
fn is_bare_char(c: char) -> bool {
    c != '/' && is_model_char(c)
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

/// Where a char first appears in a model id, and how often.
#[derive(Default)]
struct Marks {
    first: Option<usize>,
    count: usize,
}

impl Marks {
    fn note(&mut self, index: usize) {
        self.first.get_or_insert(index);
        self.count += 1;
    }
}

/// The refusal of a model id with a char no model id has: spaces, tabs or
/// line breaks named as such, any other the first of its kind.
fn unlike_a_model_id(text: &str) -> GatewayError {
    if text.chars().any(char::is_whitespace) {
        return bad_model("`model` must not contain spaces, tabs or line breaks".to_owned());
    }
    let bad = text.chars().find(|c| !is_model_char(*c)).unwrap_or('?');
    bad_model(format!(
        "`model` contains {bad:?}; model ids use letters, digits, '.', '-' and '_', with one '/' and an optional ':variant'"
    ))
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

    fn names() -> ModelNames {
        ModelNames::new()
            .default_provider("openai")
            .unwrap()
            .alias("claude-opus-4-8", "anthropic/claude-opus-4-8")
            .unwrap()
            .alias("claude-*", "anthropic/")
            .unwrap()
            .alias("claude-haiku-*", "bedrock/")
            .unwrap()
            .alias("sonnet", "anthropic/claude-sonnet-4.5:beta")
            .unwrap()
    }

    #[test]
    fn an_alias_then_the_longest_pattern_then_the_default_provider() {
        let names = names();
        for (asked, resolved) in [
            ("claude-opus-4-8", "anthropic/claude-opus-4-8"),
            ("claude-opus-4-9", "anthropic/claude-opus-4-9"),
            ("claude-haiku-4-5", "bedrock/claude-haiku-4-5"),
            ("claude-haiku-4-5:free", "bedrock/claude-haiku-4-5:free"),
            ("sonnet", "anthropic/claude-sonnet-4.5:beta"),
            ("gpt-5.5", "openai/gpt-5.5"),
            ("Claude-opus-4-8", "openai/Claude-opus-4-8"),
            ("mistral/small", "mistral/small"),
            ("claude-x/y", "claude-x/y"),
        ] {
            assert_eq!(names.resolve(asked).unwrap().as_str(), resolved, "{asked}");
        }
        // What no rule makes valid is still a specific 400.
        let error = names.resolve("gpt 5").unwrap_err();
        assert!(error.message().contains("spaces"), "{}", error.message());
        assert_eq!(names.resolve("a/b/c").unwrap_err().status(), 400);
    }

    #[test]
    fn without_a_default_provider_an_unknown_bare_id_names_the_aliases() {
        let names = ModelNames::new()
            .alias("claude-*", "anthropic/")
            .unwrap()
            .alias("gpt-5.5", "openai/gpt-5.5")
            .unwrap();
        let error = names.resolve("llama-3").unwrap_err();
        assert_eq!(
            (error.status(), error.metadata()["param"].as_str()),
            (http::StatusCode::BAD_REQUEST, Some("model"))
        );
        assert!(
            error.message().contains("model aliases")
                && error.message().contains("gpt-5.5, claude-*"),
            "{}",
            error.message()
        );
        // Nothing set: today's answer, word for word.
        assert_eq!(
            ModelNames::new().resolve("llama-3").unwrap_err().message(),
            ModelId::parse("llama-3").unwrap_err().message()
        );
        let many = (0..9).fold(ModelNames::new(), |names, index| {
            names.alias(&format!("m{index}"), "a/b").unwrap()
        });
        assert!(many.resolve("x").unwrap_err().message().contains("m4, …"));
    }

    #[test]
    fn each_bad_setting_is_refused_with_its_reason() {
        for (name, target, words) in [
            ("*", "openai/", "default_provider"),
            ("gpt*-*", "openai/", "'*' may not appear"),
            ("a/b*", "openai/", "'/' may not appear"),
            ("gpt-*", "openai/gpt-4o", "provider prefix"),
            ("gpt-*", "open ai/", "not a provider prefix"),
            ("gpt-*", "a/b/", "not a provider prefix"),
            ("gpt", "openai/", "not a model id"),
            ("gpt", "gpt-4o", "not a model id"),
            ("openai/gpt", "openai/gpt-4o", "always means itself"),
            ("g t", "openai/gpt-4o", "' '"),
            ("", "openai/gpt-4o", "1 to 200"),
        ] {
            let error = ModelNames::new()
                .alias(name, target)
                .unwrap_err()
                .to_string();
            assert!(error.contains(words), "{name:?} {target:?}: {error}");
        }
        for bad in ["", "a/b", "open ai", "a:b"] {
            assert!(ModelNames::new().default_provider(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_names_of_a_model_are_those_that_resolve_to_it() {
        let names = names();
        let id = |text| ModelId::parse(text).unwrap();
        assert_eq!(
            names.names_for(&id("anthropic/claude-opus-4-8")),
            ["claude-opus-4-8"]
        );
        assert_eq!(names.names_for(&id("anthropic/claude-3")), ["claude-3"]);
        // `claude-haiku-4-5` goes to bedrock, not here.
        assert!(
            names
                .names_for(&id("anthropic/claude-haiku-4-5"))
                .is_empty()
        );
        assert_eq!(names.names_for(&id("openai/gpt-4o")), ["gpt-4o"]);
        assert_eq!(
            names.names_for(&id("anthropic/claude-sonnet-4.5:beta")),
            ["claude-sonnet-4.5:beta", "sonnet"]
        );
        assert!(ModelNames::new().names_for(&id("openai/gpt-4o")).is_empty());
    }

    /// The checks `ModelId::parse` made char by char before its one byte
    /// pass, in the same order: the message of the first that fails.
    fn refusal_by_chars(text: &str) -> Option<String> {
        if text.is_empty() || text.len() > ModelId::MAX_LEN {
            return None;
        }
        if text.chars().any(char::is_whitespace) {
            return Some("`model` must not contain spaces, tabs or line breaks".to_owned());
        }
        if let Some(bad) = text.chars().find(|c| !is_model_char(*c)) {
            return Some(format!(
                "`model` contains {bad:?}; model ids use letters, digits, '.', '-' and '_', with one '/' and an optional ':variant'"
            ));
        }
        if text.matches('/').count() != 1 {
            return Some(format!(
                "`model` must look like provider/model, such as \"openai/gpt-4o\", with exactly one '/'; got {text:?}"
            ));
        }
        let (slash, colon) = (text.find('/'), text.find(':'));
        if text.matches(':').count() > 1 || colon < slash && colon.is_some() {
            return Some("`model` may have one ':variant', after the model name, such as \"openai/gpt-4o:free\"".to_owned());
        }
        None
    }

    proptest! {
        #[test]
        fn without_names_resolving_is_parsing(text in "\\PC{0,40}|[a-z/:.-]{0,12}") {
            let names = ModelNames::new();
            match (names.resolve(&text), ModelId::parse(&text)) {
                (Ok(resolved), Ok(parsed)) => prop_assert_eq!(resolved, parsed),
                (Err(resolved), Err(parsed)) => {
                    prop_assert_eq!(resolved.message(), parsed.message());
                    prop_assert_eq!(resolved.status(), parsed.status());
                }
                (resolved, parsed) => prop_assert!(false, "{:?} {:?}", resolved, parsed),
            }
        }

        #[test]
        fn the_byte_pass_refuses_as_the_char_checks_did(text in "\\PC{0,12}|[a-z/:. \u{e9}\u{3000}\t-]{0,12}") {
            let by_chars = refusal_by_chars(&text);
            match ModelId::parse(&text) {
                Err(error) if by_chars.is_some() => prop_assert_eq!(Some(error.message().to_owned()), by_chars),
                // Past these checks only the empty parts are refused.
                Err(error) => prop_assert!(error.message().contains("empty") || text.is_empty(), "{}", error.message()),
                Ok(id) => {
                    prop_assert_eq!(by_chars, None);
                    prop_assert_eq!(id.as_str(), text.as_str());
                }
            }
        }

        #[test]
        fn a_resolved_id_is_a_model_id_or_a_400(text in "\\PC{0,40}|[a-z/:*.-]{0,12}") {
            match names().resolve(&text) {
                Ok(id) => prop_assert_eq!(ModelId::parse(id.as_str()).unwrap(), id),
                Err(error) => prop_assert_eq!(error.status(), 400),
            }
        }

        #[test]
        fn an_id_with_a_slash_is_never_captured(
            provider in "[a-z-]{1,8}",
            model in "claude-[a-z0-9.-]{0,8}|sonnet|gpt-[a-z0-9]{1,4}",
        ) {
            let text = format!("{provider}/{model}");
            let resolved = names().resolve(&text).unwrap();
            prop_assert_eq!(resolved.as_str(), text.as_str());
        }
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
