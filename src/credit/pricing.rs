//! What requests cost: a [`Pricing`] trait and a [`PriceTable`] read from
//! JSON. Prices are credits per million tokens on the wire and integer
//! nano-credits inside; `:free` variants cost nothing.

use std::collections::HashMap;
use std::fmt;

use serde::Deserialize;

use crate::body::ModelId;
use crate::store::NANOS_PER_CREDIT;

/// The most a model may cost per million tokens, in credits: far above any
/// real price, and small enough that a request's cost never overflows.
pub const MAX_CREDITS_PER_MILLION_TOKENS: f64 = 1_000_000.0;

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

/// Where CreditGuard gets prices from.
pub trait Pricing: Send + Sync + fmt::Debug + 'static {
    /// The price of `model`; `None` when the gateway has none, which
    /// refuses the request (400) rather than guessing.
    fn price(&self, model: &ModelId) -> Option<TokenPrice>;
}

/// Prices by model id, from JSON:
///
/// ```
/// use modelgate::body::ModelId;
/// use modelgate::credit::{PriceTable, Pricing};
///
/// let table = PriceTable::from_json(r#"{
///     "models": {
///         "openai/gpt-4o": {"prompt_per_million": 2.5, "completion_per_million": 10},
///         "openai/gpt-4o:extended": {"prompt_per_million": 6, "completion_per_million": 18}
///     },
///     "default": null
/// }"#).unwrap();
/// let gpt = table.price(&ModelId::parse("openai/gpt-4o").unwrap()).unwrap();
/// // 1000 prompt tokens and 500 completion tokens: 0.0025 + 0.005 credits.
/// assert_eq!(gpt.cost_nanos(1000, 500), 7_500_000);
/// assert!(table.price(&ModelId::parse("openai/o1").unwrap()).is_none());
/// assert_eq!(table.price(&ModelId::parse("openai/o1:free").unwrap()).unwrap().cost_nanos(9, 9), 0);
/// ```
///
/// A model id with a variant is looked up as given, then without its
/// variant, then `default` applies; ids compare in any ASCII case. Every
/// `:free` variant is free.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PriceTable {
    models: HashMap<String, TokenPrice>,
    default: Option<TokenPrice>,
}

/// One model's prices as configured.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfiguredPrice {
    prompt_per_million: f64,
    completion_per_million: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfiguredTable {
    #[serde(default)]
    models: HashMap<String, ConfiguredPrice>,
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
        let mut table = PriceTable::default();
        for (id, price) in configured.models {
            if ModelId::parse(&id).is_err() {
                return Err(PricingError(format!(
                    "{id:?} is not a model id (provider/model[:variant])"
                )));
            }
            let price =
                token_price(price).map_err(|error| PricingError(format!("{id}: {error}")))?;
            table.models.insert(id.to_ascii_lowercase(), price);
        }
        table.default = configured
            .default
            .map(token_price)
            .transpose()
            .map_err(|error| PricingError(format!("default: {error}")))?;
        Ok(table)
    }

    /// Sets the price of `model` (a model id, any case).
    pub fn with_price(mut self, model: &str, price: TokenPrice) -> Self {
        self.models.insert(model.to_ascii_lowercase(), price);
        self
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

impl Pricing for PriceTable {
    fn price(&self, model: &ModelId) -> Option<TokenPrice> {
        if model.is_free() {
            return Some(TokenPrice::FREE);
        }
        self.models
            .get(&model.as_str().to_ascii_lowercase())
            .or_else(|| self.models.get(&model.base().to_ascii_lowercase()))
            .copied()
            .or(self.default)
    }
}

fn token_price(price: ConfiguredPrice) -> Result<TokenPrice, String> {
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
        assert_eq!(price("a/b:free"), TokenPrice::FREE);
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
                "a/b: prompt_per_million",
            ),
            (
                r#"{"default": {"prompt_per_million": 1, "completion_per_million": 1e300}}"#,
                "default: completion_per_million",
            ),
            (r#"{"models": {"a/b": {"prompt": 1}}}"#, "unknown field"),
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
    }
}
