//! What requests cost: a [`Pricing`] trait and a [`PriceTable`] read from
//! JSON. Prices are credits per million tokens on the wire and integer
//! nano-credits inside; the `:free` variants a table names cost nothing.
//! Beside its prices, a model may have [`PromptBounds`]: the most tokens
//! its upstream counts for its context, an image, or a file, which bound
//! what the hold counts for the parts of a prompt that are not text.

use std::collections::HashMap;
use std::fmt;

use serde::Deserialize;

use crate::body::ModelId;
use crate::store::NANOS_PER_CREDIT;

/// The most a model may cost per million tokens, in credits: far above any
/// real price, and small enough that a request's cost never overflows.
pub const MAX_CREDITS_PER_MILLION_TOKENS: f64 = 1_000_000.0;

/// The largest token bound a price table may set (`context_length`,
/// `max_tokens_per_image`, `max_tokens_per_file`): far above any real
/// model's context.
pub const MAX_BOUND_TOKENS: u64 = 1_000_000_000;

/// Prices of one model, in nano-credits per million tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenPrice {
    /// Per million prompt (input) tokens.
    pub prompt_nanos_per_million_tokens: i64,
    /// Per million completion (output) tokens.
    pub completion_nanos_per_million_tokens: i64,
}

impl TokenPrice {
    /// Nothing: what `:free` variants cost.
    pub const FREE: TokenPrice = TokenPrice {
        prompt_nanos_per_million_tokens: 0,
        completion_nanos_per_million_tokens: 0,
    };

    /// The cost of `prompt_tokens` and `completion_tokens`, in nano-credits,
    /// rounded up (a fraction of a nano is charged as one) and capped at
    /// `i64::MAX`.
    pub fn cost_nanos(&self, prompt_tokens: u64, completion_tokens: u64) -> i64 {
        let part =
            |tokens: u64, price: i64| i128::from(tokens).saturating_mul(i128::from(price.max(0)));
        let total = part(prompt_tokens, self.prompt_nanos_per_million_tokens).saturating_add(part(
            completion_tokens,
            self.completion_nanos_per_million_tokens,
        ));
        let cost = total.saturating_add(999_999) / 1_000_000;
        i64::try_from(cost).unwrap_or(i64::MAX)
    }
}

/// The most tokens a model's upstream counts for parts of a prompt the
/// gateway cannot measure, and for the whole prompt: the upper bounds the
/// hold uses ([`estimate_prompt_tokens`](super::estimate_prompt_tokens)).
/// Each is `None` when not configured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromptBounds {
    /// The model's context length: no prompt is counted as more, and a
    /// part without a bound of its own counts this much.
    pub context_length_tokens: Option<u64>,
    /// The most one image part (`image_url`) counts.
    pub max_tokens_per_image: Option<u64>,
    /// The most one file part (`file`) or audio part (`input_audio`) counts.
    pub max_tokens_per_file: Option<u64>,
}

impl PromptBounds {
    /// Each bound this one lacks, taken from `fallback`.
    pub fn or(self, fallback: PromptBounds) -> PromptBounds {
        PromptBounds {
            context_length_tokens: self
                .context_length_tokens
                .or(fallback.context_length_tokens),
            max_tokens_per_image: self.max_tokens_per_image.or(fallback.max_tokens_per_image),
            max_tokens_per_file: self.max_tokens_per_file.or(fallback.max_tokens_per_file),
        }
    }
}

/// Where CreditGuard gets prices from.
pub trait Pricing: Send + Sync + fmt::Debug + 'static {
    /// The price of `model`; `None` when the gateway has none, which
    /// refuses the request (400) rather than guessing.
    fn price(&self, model: &ModelId) -> Option<TokenPrice>;

    /// What bounds `model`'s prompt. None by default: then a request with
    /// an image, a file, audio or another part that is not text is refused
    /// (400), as its cost could not be bounded.
    fn prompt_bounds(&self, model: &ModelId) -> PromptBounds {
        let _ = model;
        PromptBounds::default()
    }
}

/// Prices by model id, from JSON:
///
/// ```
/// use modelgate::body::ModelId;
/// use modelgate::credit::{PriceTable, Pricing};
///
/// let table = PriceTable::from_json(r#"{
///     "models": {
///         "openai/gpt-4o": {"prompt_per_million": 2.5, "completion_per_million": 10,
///                           "context_length": 128000, "max_tokens_per_image": 1445},
///         "openai/gpt-4o:extended": {"prompt_per_million": 6, "completion_per_million": 18}
///     },
///     "free_models": ["meta/llama:free"],
///     "default": null
/// }"#).unwrap();
/// let gpt = table.price(&ModelId::parse("openai/gpt-4o").unwrap()).unwrap();
/// // 1000 prompt tokens and 500 completion tokens: 0.0025 + 0.005 credits.
/// assert_eq!(gpt.cost_nanos(1000, 500), 7_500_000);
/// assert!(table.price(&ModelId::parse("openai/o1").unwrap()).is_none());
/// assert_eq!(table.price(&ModelId::parse("meta/llama:free").unwrap()).unwrap().cost_nanos(9, 9), 0);
/// // A free variant the table does not name is not served: an upstream
/// // that ignored the suffix would serve the paid model for nothing.
/// assert!(table.price(&ModelId::parse("openai/gpt-4o:free").unwrap()).is_none());
/// // The variant takes its base's bounds, as it sets none of its own.
/// let bounds = table.prompt_bounds(&ModelId::parse("openai/gpt-4o:extended").unwrap());
/// assert_eq!(bounds.context_length_tokens, Some(128_000));
/// assert_eq!(bounds.max_tokens_per_file, None);
/// ```
///
/// A model id with a variant is looked up as given, then without its
/// variant, then `default` applies; ids compare in any ASCII case. A
/// `:free` variant is served only when named, in `free_models` (or in
/// `models` at price 0), and then costs nothing.
///
/// Each entry (and `default`) may also set `context_length`,
/// `max_tokens_per_image` and `max_tokens_per_file`, whole numbers of
/// tokens from 1 to [`MAX_BOUND_TOKENS`] ([`PromptBounds`]). A variant
/// takes each bound it does not set from its base model's entry; the
/// `default` entry's bounds apply to the models it prices.
///
/// It deserializes (serde) from the same JSON as [`from_json`](Self::from_json)
/// reads, checked the same way: a config holds the table, not its text.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "ConfiguredTable")]
pub struct PriceTable {
    models: HashMap<String, TokenPrice>,
    /// By model id, for the entries that set any.
    bounds: HashMap<String, PromptBounds>,
    default: Option<TokenPrice>,
    default_bounds: PromptBounds,
}

/// One model's prices as configured.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfiguredPrice {
    prompt_per_million: f64,
    completion_per_million: f64,
    // Any JSON, so that 0, 1.5 or "8k" is refused naming the field rather
    // than by serde's type error, which names none.
    #[serde(default)]
    context_length: Option<serde_json::Value>,
    #[serde(default)]
    max_tokens_per_image: Option<serde_json::Value>,
    #[serde(default)]
    max_tokens_per_file: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfiguredTable {
    #[serde(default)]
    models: HashMap<String, ConfiguredPrice>,
    #[serde(default)]
    free_models: Vec<String>,
    #[serde(default)]
    default: Option<ConfiguredPrice>,
}

/// Why a price table was refused.
#[derive(Debug, thiserror::Error)]
#[error("price table: {0}")]
pub struct PricingError(String);

impl PriceTable {
    /// Reads a JSON price table (credits per million tokens).
    pub fn from_json(text: &str) -> Result<Self, PricingError> {
        let configured: ConfiguredTable =
            serde_json::from_str(text).map_err(|error| PricingError(error.to_string()))?;
        PriceTable::try_from(configured).map_err(PricingError)
    }

    /// Sets what bounds the prompt of `model` (a model id, any case);
    /// its variants take the bounds they lack from it.
    pub fn with_prompt_bounds(mut self, model: &str, bounds: PromptBounds) -> Self {
        self.bounds.insert(model.to_ascii_lowercase(), bounds);
        self
    }

    /// What bounds the prompt of the models the default prices.
    pub fn with_default_prompt_bounds(mut self, bounds: PromptBounds) -> Self {
        self.default_bounds = bounds;
        self
    }

    /// Sets the price of `model` (a model id, any case). A `:free`
    /// variant named here is served, and costs nothing whatever `price`.
    pub fn with_price(mut self, model: &str, price: TokenPrice) -> Self {
        self.models.insert(model.to_ascii_lowercase(), price);
        self
    }

    /// Serves the `:free` variant `model` (a model id, any case), for
    /// nothing.
    pub fn with_free_model(self, model: &str) -> Self {
        self.with_price(model, TokenPrice::FREE)
    }

    /// The models the table names, with their prices, by id.
    pub fn models(&self) -> Vec<(&str, TokenPrice)> {
        let mut models: Vec<(&str, TokenPrice)> = self
            .models
            .iter()
            .map(|(id, price)| (id.as_str(), *price))
            .collect();
        models.sort_unstable_by_key(|(id, _)| *id);
        models
    }

    /// The price of models the table does not name; `None` refuses them.
    pub fn with_default(mut self, price: Option<TokenPrice>) -> Self {
        self.default = price;
        self
    }
}

/// The table as a config holds it, checked; errors name the entry and
/// field (`models["a/b"].prompt_per_million must be …`).
impl TryFrom<ConfiguredTable> for PriceTable {
    type Error = String;

    fn try_from(configured: ConfiguredTable) -> Result<Self, String> {
        let mut table = PriceTable::default();
        for (id, price) in configured.models {
            if ModelId::parse(&id).is_err() {
                return Err(format!(
                    "models[{id:?}] is not a model id (provider/model[:variant])"
                ));
            }
            let bounds =
                prompt_bounds(&price).map_err(|error| format!("models[{id:?}].{error}"))?;
            let price = token_price(&price).map_err(|error| format!("models[{id:?}].{error}"))?;
            if is_free_id(&id) && price != TokenPrice::FREE {
                return Err(format!(
                    "models[{id:?}] is a :free variant, which costs nothing: price it 0, or name it in free_models"
                ));
            }
            table.models.insert(id.to_ascii_lowercase(), price);
            if bounds != PromptBounds::default() {
                table.bounds.insert(id.to_ascii_lowercase(), bounds);
            }
        }
        for id in configured.free_models {
            if !is_free_id(&id) {
                return Err(format!(
                    "free_models: {id:?} is not a model id ending in :free (provider/model:free)"
                ));
            }
            table
                .models
                .insert(id.to_ascii_lowercase(), TokenPrice::FREE);
        }
        if let Some(default) = &configured.default {
            table.default_bounds =
                prompt_bounds(default).map_err(|error| format!("default.{error}"))?;
        }
        table.default = configured
            .default
            .as_ref()
            .map(token_price)
            .transpose()
            .map_err(|error| format!("default.{error}"))?;
        Ok(table)
    }
}

impl Pricing for PriceTable {
    fn price(&self, model: &ModelId) -> Option<TokenPrice> {
        if model.is_free() {
            // Only a named free variant, never its base's price or the
            // default: an unnamed one is not served at all.
            return self
                .models
                .contains_key(&model.as_str().to_ascii_lowercase())
                .then_some(TokenPrice::FREE);
        }
        self.models
            .get(&model.as_str().to_ascii_lowercase())
            .or_else(|| self.models.get(&model.base().to_ascii_lowercase()))
            .copied()
            .or(self.default)
    }

    fn prompt_bounds(&self, model: &ModelId) -> PromptBounds {
        let id = model.as_str().to_ascii_lowercase();
        let base = model.base().to_ascii_lowercase();
        let named = |id: &str| self.models.contains_key(id) || self.bounds.contains_key(id);
        if !named(&id) && !named(&base) {
            return self.default_bounds;
        }
        let bounds = |id: &str| self.bounds.get(id).copied().unwrap_or_default();
        bounds(&id).or(bounds(&base))
    }
}

fn is_free_id(id: &str) -> bool {
    ModelId::parse(id).is_ok_and(|model| model.is_free())
}

/// The bounds `price` sets; an error names the field, for the caller to
/// prefix with the entry.
fn prompt_bounds(price: &ConfiguredPrice) -> Result<PromptBounds, String> {
    Ok(PromptBounds {
        context_length_tokens: bound_tokens("context_length", price.context_length.as_ref())?,
        max_tokens_per_image: bound_tokens(
            "max_tokens_per_image",
            price.max_tokens_per_image.as_ref(),
        )?,
        max_tokens_per_file: bound_tokens(
            "max_tokens_per_file",
            price.max_tokens_per_file.as_ref(),
        )?,
    })
}

fn bound_tokens(field: &str, tokens: Option<&serde_json::Value>) -> Result<Option<u64>, String> {
    let Some(tokens) = tokens else {
        return Ok(None);
    };
    match tokens.as_u64() {
        Some(tokens) if (1..=MAX_BOUND_TOKENS).contains(&tokens) => Ok(Some(tokens)),
        _ => Err(format!(
            "{field} must be a whole number of tokens from 1 to {MAX_BOUND_TOKENS}, not {tokens}"
        )),
    }
}

fn token_price(price: &ConfiguredPrice) -> Result<TokenPrice, String> {
    Ok(TokenPrice {
        prompt_nanos_per_million_tokens: nanos_per_million(
            "prompt_per_million",
            price.prompt_per_million,
        )?,
        completion_nanos_per_million_tokens: nanos_per_million(
            "completion_per_million",
            price.completion_per_million,
        )?,
    })
}

fn nanos_per_million(field: &str, credits: f64) -> Result<i64, String> {
    if !credits.is_finite() || !(0.0..=MAX_CREDITS_PER_MILLION_TOKENS).contains(&credits) {
        return Err(format!(
            "{field} must be a number of credits from 0 to {MAX_CREDITS_PER_MILLION_TOKENS}"
        ));
    }
    Ok((credits * NANOS_PER_CREDIT as f64).round() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn costs_round_up_to_the_nano() {
        let price = TokenPrice {
            prompt_nanos_per_million_tokens: 1,
            completion_nanos_per_million_tokens: 3,
        };
        assert_eq!(
            price.cost_nanos(1, 0),
            1,
            "a fraction of a nano is one nano"
        );
        assert_eq!(price.cost_nanos(0, 0), 0);
        assert_eq!(price.cost_nanos(1_000_000, 1_000_000), 4);
        let dear = TokenPrice {
            prompt_nanos_per_million_tokens: i64::MAX,
            completion_nanos_per_million_tokens: i64::MAX,
        };
        assert_eq!(dear.cost_nanos(u64::MAX, u64::MAX), i64::MAX);
    }

    #[test]
    fn lookups_go_variant_then_base_then_default() {
        let table = PriceTable::from_json(
            r#"{"models": {"a/b": {"prompt_per_million": 1, "completion_per_million": 2},
                           "a/b:beta": {"prompt_per_million": 3, "completion_per_million": 4}},
                "default": {"prompt_per_million": 9, "completion_per_million": 9}}"#,
        )
        .unwrap();
        let price = |id: &str| table.price(&ModelId::parse(id).unwrap()).unwrap();
        assert_eq!(
            price("A/B").prompt_nanos_per_million_tokens,
            NANOS_PER_CREDIT
        );
        assert_eq!(
            price("a/b:nitro").prompt_nanos_per_million_tokens,
            NANOS_PER_CREDIT
        );
        assert_eq!(
            price("a/b:beta").prompt_nanos_per_million_tokens,
            3 * NANOS_PER_CREDIT
        );
        assert_eq!(
            price("x/y").prompt_nanos_per_million_tokens,
            9 * NANOS_PER_CREDIT
        );
        // Neither the base's price nor the default serves a free variant.
        assert_eq!(table.price(&ModelId::parse("a/b:free").unwrap()), None);
        assert_eq!(table.price(&ModelId::parse("x/y:free").unwrap()), None);
    }

    #[test]
    fn only_named_free_variants_are_served_and_for_nothing() {
        let table = PriceTable::from_json(
            r#"{"models": {"a/b": {"prompt_per_million": 1, "completion_per_million": 2},
                           "c/d:free": {"prompt_per_million": 0, "completion_per_million": 0}},
                "free_models": ["META/Llama:free"],
                "default": {"prompt_per_million": 9, "completion_per_million": 9}}"#,
        )
        .unwrap();
        let price = |id: &str| table.price(&ModelId::parse(id).unwrap());
        assert_eq!(price("meta/llama:free"), Some(TokenPrice::FREE));
        assert_eq!(price("C/D:FREE"), Some(TokenPrice::FREE));
        assert_eq!(price("a/b:free"), None);
        assert_eq!(price("meta/llama"), Some(price("x/y").unwrap()));
        let built = PriceTable::default()
            .with_free_model("e/f:free")
            .with_price(
                "g/h:free",
                TokenPrice {
                    prompt_nanos_per_million_tokens: 5,
                    completion_nanos_per_million_tokens: 5,
                },
            );
        assert_eq!(
            built.price(&ModelId::parse("e/f:free").unwrap()),
            Some(TokenPrice::FREE)
        );
        assert_eq!(
            built.price(&ModelId::parse("g/h:free").unwrap()),
            Some(TokenPrice::FREE)
        );
        let ids: Vec<&str> = table.models().into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, ["a/b", "c/d:free", "meta/llama:free"]);
    }

    #[test]
    fn bad_tables_are_refused_naming_the_entry() {
        for (text, words) in [
            (
                r#"{"models": {"gpt-4o": {"prompt_per_million": 1, "completion_per_million": 1}}}"#,
                "not a model id",
            ),
            (
                r#"{"models": {"a/b": {"prompt_per_million": -1, "completion_per_million": 1}}}"#,
                r#"models["a/b"].prompt_per_million must be a number of credits"#,
            ),
            (
                r#"{"default": {"prompt_per_million": 1, "completion_per_million": 1e300}}"#,
                "default.completion_per_million must be",
            ),
            (r#"{"models": {"a/b": {"prompt": 1}}}"#, "unknown field"),
            (
                r#"{"models": {"a/b:free": {"prompt_per_million": 1, "completion_per_million": 0}}}"#,
                r#"models["a/b:free"] is a :free variant, which costs nothing"#,
            ),
            (r#"{"free_models": ["a/b"]}"#, "free_models: \"a/b\" is not"),
            (
                r#"{"free_models": ["nope:free"]}"#,
                "free_models: \"nope:free\"",
            ),
            (r#"{"free_models": "a/b:free"}"#, "invalid type"),
        ] {
            let error = PriceTable::from_json(text).unwrap_err().to_string();
            assert!(error.contains(words), "{text}: {error}");
        }
    }

    #[test]
    fn prompt_bounds_go_variant_then_base_field_by_field_then_default() {
        let table = PriceTable::from_json(
            r#"{"models": {
                    "a/b": {"prompt_per_million": 1, "completion_per_million": 2,
                            "context_length": 128000, "max_tokens_per_image": 1445},
                    "a/b:long": {"prompt_per_million": 1, "completion_per_million": 2,
                                 "context_length": 1000000, "max_tokens_per_file": null},
                    "c/d": {"prompt_per_million": 1, "completion_per_million": 2},
                    "e/f:free": {"prompt_per_million": 0, "completion_per_million": 0,
                                 "max_tokens_per_file": 7}},
                "free_models": ["a/b:free"],
                "default": {"prompt_per_million": 9, "completion_per_million": 9,
                            "context_length": 8192}}"#,
        )
        .unwrap();
        let bounds = |id: &str| table.prompt_bounds(&ModelId::parse(id).unwrap());
        let base = PromptBounds {
            context_length_tokens: Some(128_000),
            max_tokens_per_image: Some(1445),
            max_tokens_per_file: None,
        };
        assert_eq!(bounds("A/B"), base);
        // A variant priced by its base, and a free one, take its bounds.
        assert_eq!(bounds("a/b:nitro"), base);
        assert_eq!(bounds("a/b:free"), base);
        // A variant's own bound wins; what it lacks comes from its base.
        assert_eq!(
            bounds("a/b:long"),
            PromptBounds {
                context_length_tokens: Some(1_000_000),
                ..base
            }
        );
        assert_eq!(
            bounds("e/f:free").max_tokens_per_file,
            Some(7),
            "a free variant priced 0 may set its own"
        );
        // A named model never takes the default's bounds; the models the
        // default prices do.
        assert_eq!(bounds("c/d"), PromptBounds::default());
        assert_eq!(bounds("x/y").context_length_tokens, Some(8192));
        assert_eq!(bounds("x/y:beta").context_length_tokens, Some(8192));
        // Built in code: the same rules.
        let built = PriceTable::default()
            .with_price("g/h", TokenPrice::FREE)
            .with_prompt_bounds("g/h", base)
            .with_default_prompt_bounds(PromptBounds {
                max_tokens_per_file: Some(3),
                ..PromptBounds::default()
            });
        assert_eq!(built.prompt_bounds(&ModelId::parse("g/h:x").unwrap()), base);
        assert_eq!(
            built
                .prompt_bounds(&ModelId::parse("i/j").unwrap())
                .max_tokens_per_file,
            Some(3)
        );
        // Pricing of its own makes no bounds: every part needs one set.
        #[derive(Debug)]
        struct Flat;
        impl Pricing for Flat {
            fn price(&self, _: &ModelId) -> Option<TokenPrice> {
                Some(TokenPrice::FREE)
            }
        }
        assert_eq!(
            Flat.prompt_bounds(&ModelId::parse("a/b").unwrap()),
            PromptBounds::default()
        );
    }

    #[test]
    fn bad_bounds_are_refused_naming_the_field_path() {
        for (text, words) in [
            (
                r#"{"models": {"a/b": {"prompt_per_million": 1, "completion_per_million": 1, "context_length": 0}}}"#,
                r#"models["a/b"].context_length must be a whole number of tokens from 1 to 1000000000, not 0"#,
            ),
            (
                r#"{"models": {"a/b": {"prompt_per_million": 1, "completion_per_million": 1, "max_tokens_per_image": -5}}}"#,
                r#"models["a/b"].max_tokens_per_image must be"#,
            ),
            (
                r#"{"models": {"a/b": {"prompt_per_million": 1, "completion_per_million": 1, "max_tokens_per_file": 1.5}}}"#,
                r#"models["a/b"].max_tokens_per_file must be"#,
            ),
            (
                r#"{"models": {"a/b": {"prompt_per_million": 1, "completion_per_million": 1, "context_length": "128k"}}}"#,
                r#"models["a/b"].context_length must be a whole number of tokens from 1 to 1000000000, not "128k""#,
            ),
            (
                r#"{"models": {"a/b": {"prompt_per_million": 1, "completion_per_million": 1, "context_length": 1000000001}}}"#,
                r#"models["a/b"].context_length"#,
            ),
            (
                r#"{"default": {"prompt_per_million": 1, "completion_per_million": 1, "max_tokens_per_image": true}}"#,
                "default.max_tokens_per_image must be",
            ),
            (
                r#"{"models": {"a/b": {"prompt_per_million": 1, "completion_per_million": 1, "context_lenght": 8}}}"#,
                "unknown field `context_lenght`",
            ),
        ] {
            let error = PriceTable::from_json(text).unwrap_err().to_string();
            assert!(error.contains(words), "{text}: {error}");
        }
    }

    proptest! {
        #[test]
        fn cost_is_monotonic_and_never_negative(
            prompt_price in 0i64..1_000_000_000_000_000,
            completion_price in 0i64..1_000_000_000_000_000,
            prompt in 0u64..10_000_000,
            completion in 0u64..10_000_000,
            more in 0u64..1000,
        ) {
            let price = TokenPrice { prompt_nanos_per_million_tokens: prompt_price, completion_nanos_per_million_tokens: completion_price };
            let cost = price.cost_nanos(prompt, completion);
            prop_assert!(cost >= 0);
            prop_assert!(price.cost_nanos(prompt + more, completion + more) >= cost);
        }

        #[test]
        fn no_table_text_panics(text in "\\PC{0,80}") {
            let _ = PriceTable::from_json(&text);
        }

        #[test]
        fn bounds_in_range_are_kept_and_others_refused_naming_them(
            tokens in prop_oneof![
                1u64..=MAX_BOUND_TOKENS,
                Just(MAX_BOUND_TOKENS),
                Just(MAX_BOUND_TOKENS + 1),
                any::<u64>(),
            ].prop_map(i128::from),
            negative in any::<bool>(),
            field in prop::sample::select(vec!["context_length", "max_tokens_per_image", "max_tokens_per_file"]),
            variant in any::<bool>(),
        ) {
            let tokens = if negative { -tokens } else { tokens };
            let id = if variant { "a/b:beta" } else { "a/b" };
            let text = format!(
                r#"{{"models": {{"{id}": {{"prompt_per_million": 1, "completion_per_million": 1, "{field}": {tokens}}}}}}}"#
            );
            let valid = (1..=i128::from(MAX_BOUND_TOKENS)).contains(&tokens);
            match PriceTable::from_json(&text) {
                Ok(table) => {
                    prop_assert!(valid, "{text} accepted");
                    let bounds = table.prompt_bounds(&ModelId::parse(id).unwrap());
                    let kept = match field {
                        "context_length" => bounds.context_length_tokens,
                        "max_tokens_per_image" => bounds.max_tokens_per_image,
                        _ => bounds.max_tokens_per_file,
                    };
                    prop_assert_eq!(kept.map(i128::from), Some(tokens));
                }
                Err(error) => {
                    prop_assert!(!valid, "{text}: {error}");
                    let path = format!("models[{id:?}].{field} must be");
                    prop_assert!(error.to_string().contains(&path), "{error}");
                }
            }
        }
    }
}
