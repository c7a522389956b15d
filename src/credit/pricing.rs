//! What requests cost: a [`Pricing`] trait and a [`PriceTable`] read from
//! JSON. Prices are credits per million tokens on the wire and integer
//! nano-credits inside; the `:free` variants a table names cost nothing.
//! Beside its prices, a model may have [`PromptBounds`]: the most tokens
//! its upstream counts for its context, an image, or a file, which bound
//! what the hold counts for the parts of a prompt that are not text.

use std::collections::HashMap;
use std::fmt;

use serde::Deserialize;

use super::Usage;
use crate::body::ModelId;
use crate::store::{FastMap, NANOS_PER_CREDIT};

/// The most a model may cost per million tokens, in credits: far above any
/// real price, and small enough that a request's cost never overflows.
pub const MAX_CREDITS_PER_MILLION_TOKENS: f64 = 1_000_000.0;

/// The largest token bound a price table may set (`context_length`,
/// `max_tokens_per_image`, `max_tokens_per_file`): far above any real
/// model's context.
pub const MAX_BOUND_TOKENS: u64 = 1_000_000_000;

/// The most `overrides` a price may have (rates past a prompt size).
pub const MAX_PRICE_OVERRIDES: usize = 4;

/// Token rates, in nano-credits per million tokens. A rate left `None`
/// is the one it refines: cache reads and five-minute writes the prompt
/// rate, one-hour writes the five-minute write rate, reasoning the
/// completion rate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenRates {
    /// Per million prompt (input) tokens.
    pub prompt_nanos_per_million_tokens: i64,
    /// Per million completion (output) tokens.
    pub completion_nanos_per_million_tokens: i64,
    /// Per million prompt tokens read from the upstream's cache.
    pub cache_read_nanos_per_million_tokens: Option<i64>,
    /// Per million prompt tokens written to the cache for five minutes.
    pub cache_write_nanos_per_million_tokens: Option<i64>,
    /// Per million prompt tokens written to the cache for an hour.
    pub cache_write_1h_nanos_per_million_tokens: Option<i64>,
    /// Per million reasoning tokens, when priced apart from completion.
    pub reasoning_nanos_per_million_tokens: Option<i64>,
}

impl TokenRates {
    fn cache_read(&self) -> i64 {
        self.cache_read_nanos_per_million_tokens
            .unwrap_or(self.prompt_nanos_per_million_tokens)
    }

    fn cache_write(&self) -> i64 {
        self.cache_write_nanos_per_million_tokens
            .unwrap_or(self.prompt_nanos_per_million_tokens)
    }

    fn cache_write_1h(&self) -> i64 {
        self.cache_write_1h_nanos_per_million_tokens
            .unwrap_or_else(|| self.cache_write())
    }

    fn reasoning(&self) -> i64 {
        self.reasoning_nanos_per_million_tokens
            .unwrap_or(self.completion_nanos_per_million_tokens)
    }

    /// The dearest rate a prompt token can be charged at.
    fn dearest_prompt(&self) -> i64 {
        self.prompt_nanos_per_million_tokens
            .max(self.cache_read())
            .max(self.cache_write())
            .max(self.cache_write_1h())
    }

    /// The dearest rate a completion token can be charged at.
    fn dearest_completion(&self) -> i64 {
        self.completion_nanos_per_million_tokens
            .max(self.reasoning())
    }
}

/// Rates that replace a price's own for a prompt of at least
/// `min_prompt_tokens` (every prompt token counted, cached or not): a
/// long-context tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PriceOverride {
    /// The prompt size from which `rates` apply.
    pub min_prompt_tokens: u64,
    /// The rates then, each one given (a config's override takes the
    /// rates it does not name from the price it overrides).
    pub rates: TokenRates,
}

/// Prices of one model: token rates, fees, and rates past a prompt size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenPrice {
    /// The token rates (of a prompt below every override).
    pub rates: TokenRates,
    /// Charged once per request answered with usage, in nano-credits.
    pub request_nanos: i64,
    /// Charged per web search the upstream reports, in nano-credits.
    pub web_search_nanos: i64,
    /// Rates past a prompt size; the override with the largest
    /// `min_prompt_tokens` the prompt reaches applies.
    pub overrides: [Option<PriceOverride>; MAX_PRICE_OVERRIDES],
    /// An embeddings model (`"embeddings": true`): served on the
    /// embeddings route only, and no other model there.
    pub embeddings_only: bool,
}

impl TokenPrice {
    /// Nothing: what `:free` variants cost.
    pub const FREE: TokenPrice = TokenPrice::per_million_tokens(0, 0);

    /// A price of two rates (nano-credits per million prompt and
    /// completion tokens), no fee, no other rate.
    pub const fn per_million_tokens(prompt_nanos: i64, completion_nanos: i64) -> TokenPrice {
        TokenPrice {
            rates: TokenRates {
                prompt_nanos_per_million_tokens: prompt_nanos,
                completion_nanos_per_million_tokens: completion_nanos,
                cache_read_nanos_per_million_tokens: None,
                cache_write_nanos_per_million_tokens: None,
                cache_write_1h_nanos_per_million_tokens: None,
                reasoning_nanos_per_million_tokens: None,
            },
            request_nanos: 0,
            web_search_nanos: 0,
            overrides: [None; MAX_PRICE_OVERRIDES],
            embeddings_only: false,
        }
    }

    /// The rates a prompt of `prompt_tokens` is charged at.
    pub fn rates_for(&self, prompt_tokens: u64) -> &TokenRates {
        self.overrides
            .iter()
            .flatten()
            .filter(|tier| tier.min_prompt_tokens <= prompt_tokens)
            .max_by_key(|tier| tier.min_prompt_tokens)
            .map_or(&self.rates, |tier| &tier.rates)
    }

    /// Whether what a request costs depends on its prompt: a prompt token
    /// can cost something, or the prompt's size picks an override (whose
    /// completion rate may be dearer). Then the hold must bound the prompt.
    pub fn charges_prompt(&self) -> bool {
        self.overrides.iter().flatten().next().is_some() || self.rates.dearest_prompt() > 0
    }

    /// The most a request of up to `prompt_tokens` and `completion_tokens`
    /// can cost, in nano-credits, rounded up (a fraction of a nano is
    /// charged as one) and capped at `i64::MAX`: every token at the
    /// dearest rate it could be charged at (cached or not, reasoning or
    /// not, under any override a prompt that long can reach), and the
    /// request's fee. What a hold covers. With two rates alone, it is
    /// exactly what those tokens cost. Web searches are not in it: a
    /// request that may search is held for its searches apart (its
    /// `max_uses` at [`web_search_nanos`](Self::web_search_nanos)).
    pub fn cost_nanos(&self, prompt_tokens: u64, completion_tokens: u64) -> i64 {
        let most = std::iter::once(&self.rates)
            .chain(
                self.overrides
                    .iter()
                    .flatten()
                    .filter(|tier| tier.min_prompt_tokens <= prompt_tokens)
                    .map(|tier| &tier.rates),
            )
            .map(|rates| {
                [
                    part(prompt_tokens, rates.dearest_prompt()),
                    part(completion_tokens, rates.dearest_completion()),
                ]
                .iter()
                .fold(0i128, |sum, part| sum.saturating_add(*part))
            })
            .max()
            .unwrap_or(0);
        with_fees(most, [(1, self.request_nanos)])
    }

    /// What `usage` costs, in nano-credits, rounded up once and capped at
    /// `i64::MAX`: the prompt's uncached, cache-read and cache-written
    /// tokens and the completion's reasoning and other tokens each at its
    /// rate (of the override the whole prompt reaches), the request's fee
    /// and each web search's. Never more than
    /// [`cost_nanos`](Self::cost_nanos) of its counts, but for searches.
    pub fn charge_nanos(&self, usage: &Usage) -> i64 {
        let tokens = self
            .token_parts(usage)
            .iter()
            .fold(0i128, |sum, (_, part)| sum.saturating_add(*part));
        with_fees(
            tokens,
            [
                (1, self.request_nanos),
                (usage.web_search_requests, self.web_search_nanos),
            ],
        )
    }

    /// What makes up [`charge_nanos`](Self::charge_nanos): each kind of
    /// token and each fee, by its name in a generation record's
    /// `cost_details` (`prompt`, `cache_read`, `cache_write`,
    /// `cache_write_1h`, `completion`, `reasoning`, `request`,
    /// `web_search`), in nano-credits, each rounded up on its own: their
    /// sum may pass the charge, rounded once, by a few nano-credits.
    pub fn charge_breakdown(&self, usage: &Usage) -> [(&'static str, i64); 8] {
        let tokens = self
            .token_parts(usage)
            .map(|(name, millionths)| (name, with_fees(millionths, [])));
        let fee = |count: u64, nanos: i64| with_fees(0, [(count, nanos)]);
        [
            tokens[0],
            tokens[1],
            tokens[2],
            tokens[3],
            tokens[4],
            tokens[5],
            ("request", fee(1, self.request_nanos)),
            (
                "web_search",
                fee(usage.web_search_requests, self.web_search_nanos),
            ),
        ]
    }

    /// Each kind of token `usage` counts at its rate (of the override the
    /// whole prompt reaches), in millionths of a nano-credit.
    fn token_parts(&self, usage: &Usage) -> [(&'static str, i128); 6] {
        let rates = self.rates_for(usage.prompt_tokens);
        // The details are within their counts (Usage keeps them so); the
        // saturating steps only make that plain.
        let cache_read = usage.cache_read_tokens.min(usage.prompt_tokens);
        let cache_write_1h = usage
            .cache_write_1h_tokens
            .min(usage.prompt_tokens - cache_read);
        let cache_write = usage
            .cache_write_tokens
            .min(usage.prompt_tokens - cache_read - cache_write_1h);
        let uncached = usage.prompt_tokens - cache_read - cache_write_1h - cache_write;
        let reasoning = usage.reasoning_tokens.min(usage.completion_tokens);
        [
            (
                "prompt",
                part(uncached, rates.prompt_nanos_per_million_tokens),
            ),
            ("cache_read", part(cache_read, rates.cache_read())),
            ("cache_write", part(cache_write, rates.cache_write())),
            (
                "cache_write_1h",
                part(cache_write_1h, rates.cache_write_1h()),
            ),
            (
                "completion",
                part(
                    usage.completion_tokens - reasoning,
                    rates.completion_nanos_per_million_tokens,
                ),
            ),
            ("reasoning", part(reasoning, rates.reasoning())),
        ]
    }
}

/// `tokens` at `nanos_per_million`, in millionths of a nano-credit.
fn part(tokens: u64, nanos_per_million: i64) -> i128 {
    i128::from(tokens).saturating_mul(i128::from(nanos_per_million.max(0)))
}

/// `millionths` of a nano-credit rounded up, plus each count of fees.
fn with_fees<const N: usize>(millionths: i128, fees: [(u64, i64); N]) -> i64 {
    let fees = fees.iter().fold(0i128, |sum, (count, nanos)| {
        sum.saturating_add(i128::from(*count).saturating_mul(i128::from((*nanos).max(0))))
    });
    let cost = (millionths.saturating_add(999_999) / 1_000_000).saturating_add(fees);
    i64::try_from(cost).unwrap_or(i64::MAX)
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
    // Looked up on every request; the table is the operator's, so
    // foldhash (not SipHash) is enough.
    models: FastMap<String, TokenPrice>,
    /// By model id, for the entries that set any.
    bounds: FastMap<String, PromptBounds>,
    default: Option<TokenPrice>,
    default_bounds: PromptBounds,
}

/// One model's prices as configured.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfiguredPrice {
    prompt_per_million: f64,
    completion_per_million: f64,
    #[serde(default)]
    input_cache_read_per_million: Option<f64>,
    #[serde(default)]
    input_cache_write_per_million: Option<f64>,
    #[serde(default)]
    input_cache_write_1h_per_million: Option<f64>,
    #[serde(default)]
    internal_reasoning_per_million: Option<f64>,
    /// Credits per request.
    #[serde(default)]
    request: Option<f64>,
    /// Credits per web search.
    #[serde(default)]
    web_search: Option<f64>,
    #[serde(default)]
    overrides: Vec<ConfiguredOverride>,
    /// An embeddings model.
    #[serde(default)]
    embeddings: bool,
    // Any JSON, so that 0, 1.5 or "8k" is refused naming the field rather
    // than by serde's type error, which names none.
    #[serde(default)]
    context_length: Option<serde_json::Value>,
    #[serde(default)]
    max_tokens_per_image: Option<serde_json::Value>,
    #[serde(default)]
    max_tokens_per_file: Option<serde_json::Value>,
}

/// Rates past a prompt size, as configured: those it names replace the
/// price's own.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfiguredOverride {
    min_prompt_tokens: serde_json::Value,
    #[serde(default)]
    prompt_per_million: Option<f64>,
    #[serde(default)]
    completion_per_million: Option<f64>,
    #[serde(default)]
    input_cache_read_per_million: Option<f64>,
    #[serde(default)]
    input_cache_write_per_million: Option<f64>,
    #[serde(default)]
    input_cache_write_1h_per_million: Option<f64>,
    #[serde(default)]
    internal_reasoning_per_million: Option<f64>,
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
    let optional = |field: &str, credits: Option<f64>| {
        credits
            .map(|credits| nanos_per_million(field, credits))
            .transpose()
    };
    let rates = rates_over(
        TokenRates::default(),
        NamedRates {
            prompt: Some(price.prompt_per_million),
            completion: Some(price.completion_per_million),
            cache_read: price.input_cache_read_per_million,
            cache_write: price.input_cache_write_per_million,
            cache_write_1h: price.input_cache_write_1h_per_million,
            reasoning: price.internal_reasoning_per_million,
        },
    )?;
    if price.overrides.len() > MAX_PRICE_OVERRIDES {
        return Err(format!(
            "overrides has {} entries; at most {MAX_PRICE_OVERRIDES}",
            price.overrides.len()
        ));
    }
    let mut overrides = [None; MAX_PRICE_OVERRIDES];
    for (index, configured) in price.overrides.iter().enumerate() {
        let tier = price_override(&rates, configured)
            .map_err(|error| format!("overrides[{index}].{error}"))?;
        if overrides
            .iter()
            .flatten()
            .any(|other: &PriceOverride| other.min_prompt_tokens == tier.min_prompt_tokens)
        {
            return Err(format!(
                "overrides[{index}].min_prompt_tokens repeats another override's ({})",
                tier.min_prompt_tokens
            ));
        }
        overrides[index] = Some(tier);
    }
    Ok(TokenPrice {
        rates,
        request_nanos: optional("request", price.request)?.unwrap_or(0),
        web_search_nanos: optional("web_search", price.web_search)?.unwrap_or(0),
        overrides,
        embeddings_only: price.embeddings,
    })
}

/// An override's rates: those it names, the rest `base`'s.
fn price_override(
    base: &TokenRates,
    configured: &ConfiguredOverride,
) -> Result<PriceOverride, String> {
    let min_prompt_tokens = bound_tokens("min_prompt_tokens", Some(&configured.min_prompt_tokens))?
        .unwrap_or(MAX_BOUND_TOKENS);
    let rates = rates_over(
        *base,
        NamedRates {
            prompt: configured.prompt_per_million,
            completion: configured.completion_per_million,
            cache_read: configured.input_cache_read_per_million,
            cache_write: configured.input_cache_write_per_million,
            cache_write_1h: configured.input_cache_write_1h_per_million,
            reasoning: configured.internal_reasoning_per_million,
        },
    )?;
    Ok(PriceOverride {
        min_prompt_tokens,
        rates,
    })
}

/// The token rates a price or an override names, in credits per million
/// tokens (`None`: not named).
struct NamedRates {
    prompt: Option<f64>,
    completion: Option<f64>,
    cache_read: Option<f64>,
    cache_write: Option<f64>,
    cache_write_1h: Option<f64>,
    reasoning: Option<f64>,
}

/// `base` with each rate `named` names in place of its own; an error
/// names the field.
fn rates_over(base: TokenRates, named: NamedRates) -> Result<TokenRates, String> {
    let replaced = |field: &str, credits: Option<f64>, own: i64| {
        credits.map_or(Ok(own), |credits| nanos_per_million(field, credits))
    };
    let refined = |field: &str, credits: Option<f64>, own: Option<i64>| {
        credits.map_or(Ok(own), |credits| {
            nanos_per_million(field, credits).map(Some)
        })
    };
    Ok(TokenRates {
        prompt_nanos_per_million_tokens: replaced(
            "prompt_per_million",
            named.prompt,
            base.prompt_nanos_per_million_tokens,
        )?,
        completion_nanos_per_million_tokens: replaced(
            "completion_per_million",
            named.completion,
            base.completion_nanos_per_million_tokens,
        )?,
        cache_read_nanos_per_million_tokens: refined(
            "input_cache_read_per_million",
            named.cache_read,
            base.cache_read_nanos_per_million_tokens,
        )?,
        cache_write_nanos_per_million_tokens: refined(
            "input_cache_write_per_million",
            named.cache_write,
            base.cache_write_nanos_per_million_tokens,
        )?,
        cache_write_1h_nanos_per_million_tokens: refined(
            "input_cache_write_1h_per_million",
            named.cache_write_1h,
            base.cache_write_1h_nanos_per_million_tokens,
        )?,
        reasoning_nanos_per_million_tokens: refined(
            "internal_reasoning_per_million",
            named.reasoning,
            base.reasoning_nanos_per_million_tokens,
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
        let price = TokenPrice::per_million_tokens(1, 3);
        assert_eq!(
            price.cost_nanos(1, 0),
            1,
            "a fraction of a nano is one nano"
        );
        assert_eq!(price.cost_nanos(0, 0), 0);
        assert_eq!(price.cost_nanos(1_000_000, 1_000_000), 4);
        let dear = TokenPrice::per_million_tokens(i64::MAX, i64::MAX);
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
            price("A/B").rates.prompt_nanos_per_million_tokens,
            NANOS_PER_CREDIT
        );
        assert_eq!(
            price("a/b:nitro").rates.prompt_nanos_per_million_tokens,
            NANOS_PER_CREDIT
        );
        assert_eq!(
            price("a/b:beta").rates.prompt_nanos_per_million_tokens,
            3 * NANOS_PER_CREDIT
        );
        assert_eq!(
            price("x/y").rates.prompt_nanos_per_million_tokens,
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
            .with_price("g/h:free", TokenPrice::per_million_tokens(5, 5));
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

    /// A price with every rate apart, in credits per million tokens:
    /// prompt 2, completion 8, cache reads 0.2, five-minute writes 2.5,
    /// one-hour writes 4, reasoning 12; 0.01 a request, 0.005 a search;
    /// from 1,000 prompt tokens, prompt 4 and completion 16 (the cache
    /// rates as below it).
    fn every_rate() -> TokenPrice {
        PriceTable::from_json(
            r#"{"models": {"a/b": {
                "prompt_per_million": 2, "completion_per_million": 8,
                "input_cache_read_per_million": 0.2, "input_cache_write_per_million": 2.5,
                "input_cache_write_1h_per_million": 4, "internal_reasoning_per_million": 12,
                "request": 0.01, "web_search": 0.005,
                "overrides": [{"min_prompt_tokens": 1000, "prompt_per_million": 4,
                               "completion_per_million": 16}]}}}"#,
        )
        .unwrap()
        .price(&ModelId::parse("a/b").unwrap())
        .unwrap()
    }

    #[test]
    fn each_kind_of_token_and_fee_is_charged_at_its_own_rate() {
        let price = every_rate();
        let usage = |prompt, completion| Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            ..Usage::default()
        };
        // Nano-credits, by hand: tokens × credits per million × 1,000
        // (nanos per credit ÷ tokens per million), plus 10,000,000 a request.
        let request = 10_000_000;
        // 100 prompt tokens at 2, 10 completion at 8.
        assert_eq!(
            price.charge_nanos(&usage(100, 10)),
            200_000 + 80_000 + request
        );
        // 60 of the 100 read from the cache at 0.2: 40 × 2 + 60 × 0.2.
        let cached = Usage {
            cache_read_tokens: 60,
            ..usage(100, 0)
        };
        assert_eq!(price.charge_nanos(&cached), 80_000 + 12_000 + request);
        // 30 written for five minutes at 2.5, 20 for an hour at 4, 50 plain.
        let written = Usage {
            cache_write_tokens: 30,
            cache_write_1h_tokens: 20,
            ..usage(100, 0)
        };
        assert_eq!(
            price.charge_nanos(&written),
            100_000 + 75_000 + 80_000 + request
        );
        // 40 of 50 completion tokens reasoning at 12, 10 at 8.
        let reasoned = Usage {
            reasoning_tokens: 40,
            ..usage(0, 50)
        };
        assert_eq!(price.charge_nanos(&reasoned), 480_000 + 80_000 + request);
        // Three searches at 0.005 each.
        let searched = Usage {
            web_search_requests: 3,
            ..usage(0, 0)
        };
        assert_eq!(price.charge_nanos(&searched), 15_000_000 + request);
        // A prompt of 1,000 tokens (cached ones count) is past the
        // override: 500 plain at 4, 500 cached at 0.2, 10 completion at 16.
        let long = Usage {
            cache_read_tokens: 500,
            ..usage(1_000, 10)
        };
        assert_eq!(
            price.charge_nanos(&long),
            2_000_000 + 100_000 + 160_000 + request
        );
        // Without reasoning or cache rates of its own, a price charges them
        // as prompt and completion: the two-rate charge of old.
        let plain = TokenPrice::per_million_tokens(2_000_000_000, 8_000_000_000);
        let mixed = Usage {
            cache_read_tokens: 60,
            cache_write_tokens: 20,
            reasoning_tokens: 5,
            ..usage(100, 10)
        };
        assert_eq!(plain.charge_nanos(&mixed), plain.cost_nanos(100, 10));
        assert_eq!(plain.charge_nanos(&mixed), 280_000);
    }

    #[test]
    fn the_most_a_request_can_cost_takes_the_dearest_rate_of_each_token() {
        let price = every_rate();
        // Below the override: prompt tokens at 4 (one-hour writes), completion at 12.
        assert_eq!(price.cost_nanos(100, 10), 400_000 + 120_000 + 10_000_000);
        // A prompt bound that reaches the override: prompt at 4, completion at 16.
        assert_eq!(
            price.cost_nanos(1_000, 10),
            4_000_000 + 160_000 + 10_000_000
        );
        assert!(price.charges_prompt());
        assert!(!TokenPrice::per_million_tokens(0, 5).charges_prompt());
        // Free prompts, but an override by prompt size: the prompt decides
        // the completion's rate, so it must be bounded too.
        let tiered = TokenPrice {
            overrides: [
                Some(PriceOverride {
                    min_prompt_tokens: 100_000,
                    rates: TokenRates {
                        completion_nanos_per_million_tokens: 50,
                        ..TokenPrice::FREE.rates
                    },
                }),
                None,
                None,
                None,
            ],
            ..TokenPrice::per_million_tokens(0, 5)
        };
        assert!(tiered.charges_prompt());
        let cache_writes_only = TokenPrice {
            rates: TokenRates {
                cache_write_nanos_per_million_tokens: Some(1),
                ..TokenPrice::FREE.rates
            },
            ..TokenPrice::FREE
        };
        assert!(cache_writes_only.charges_prompt());
    }

    #[test]
    fn bad_rates_fees_and_overrides_are_refused_naming_the_field() {
        let refused = |entry: &str| {
            PriceTable::from_json(&format!(
                r#"{{"models": {{"a/b": {{"prompt_per_million": 1, "completion_per_million": 1, {entry}}}}}}}"#
            ))
            .unwrap_err()
            .to_string()
        };
        for (entry, field) in [
            (
                r#""input_cache_read_per_million": -1"#,
                "input_cache_read_per_million",
            ),
            (
                r#""input_cache_write_1h_per_million": 1e9"#,
                "input_cache_write_1h_per_million",
            ),
            (
                r#""internal_reasoning_per_million": -0.5"#,
                "internal_reasoning_per_million",
            ),
            (r#""request": -1"#, "request"),
            (r#""web_search": 2e6"#, "web_search"),
            (
                r#""overrides": [{"min_prompt_tokens": 0}]"#,
                "overrides[0].min_prompt_tokens",
            ),
            (
                r#""overrides": [{"min_prompt_tokens": "200k"}]"#,
                "overrides[0].min_prompt_tokens",
            ),
            (
                r#""overrides": [{"min_prompt_tokens": 5, "prompt_per_million": -2}]"#,
                "overrides[0].prompt_per_million",
            ),
            (
                r#""overrides": [{"min_prompt_tokens": 5}, {"min_prompt_tokens": 5}]"#,
                "overrides[1].min_prompt_tokens",
            ),
        ] {
            let message = refused(entry);
            assert!(
                message.contains(&format!("models[\"a/b\"].{field}")),
                "{entry}: {message}"
            );
        }
        let five: Vec<String> = (1..=5)
            .map(|min| format!(r#"{{"min_prompt_tokens": {min}}}"#))
            .collect();
        let message = refused(&format!(r#""overrides": [{}]"#, five.join(",")));
        assert!(message.contains("at most 4"), "{message}");
        assert!(refused(r#""cache_read": 1"#).contains("unknown field"));
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
            let price = TokenPrice::per_million_tokens(prompt_price, completion_price);
            let cost = price.cost_nanos(prompt, completion);
            prop_assert!(cost >= 0);
            prop_assert!(price.cost_nanos(prompt + more, completion + more) >= cost);
        }

        /// What a hold covers is never less than what the usage within its
        /// bounds is charged (searches apart, which their own bound holds).
        #[test]
        fn no_usage_within_the_bounds_is_charged_more_than_the_hold(
            rates in proptest::collection::vec(0i64..1_000_000_000_000, 6),
            set in proptest::collection::vec(any::<bool>(), 4),
            tiers in proptest::collection::vec((1u64..20_000, proptest::collection::vec(0i64..1_000_000_000_000, 2)), 0..=4),
            request in 0i64..1_000_000_000,
            prompt_bound in 0u64..30_000,
            completion_bound in 0u64..30_000,
            shares in proptest::collection::vec(0.0f64..=1.0, 6),
        ) {
            let optional = |index: usize| set[index - 2].then_some(rates[index]);
            let base = TokenRates {
                prompt_nanos_per_million_tokens: rates[0],
                completion_nanos_per_million_tokens: rates[1],
                cache_read_nanos_per_million_tokens: optional(2),
                cache_write_nanos_per_million_tokens: optional(3),
                cache_write_1h_nanos_per_million_tokens: optional(4),
                reasoning_nanos_per_million_tokens: optional(5),
            };
            let mut overrides = [None; MAX_PRICE_OVERRIDES];
            for (slot, (min, tier_rates)) in overrides.iter_mut().zip(&tiers) {
                *slot = Some(PriceOverride {
                    min_prompt_tokens: *min,
                    rates: TokenRates {
                        prompt_nanos_per_million_tokens: tier_rates[0],
                        completion_nanos_per_million_tokens: tier_rates[1],
                        ..base
                    },
                });
            }
            let price = TokenPrice { rates: base, request_nanos: request, web_search_nanos: 0, overrides, embeddings_only: false };
            let share = |of: u64, index: usize| (of as f64 * shares[index]) as u64;
            let prompt = share(prompt_bound, 0);
            let completion = share(completion_bound, 1);
            let usage = Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
                cache_read_tokens: share(prompt, 2),
                cache_write_tokens: share(prompt, 3),
                cache_write_1h_tokens: share(prompt, 4),
                reasoning_tokens: share(completion, 5),
                ..Usage::default()
            };
            let charged = price.charge_nanos(&usage);
            prop_assert!(charged >= 0);
            prop_assert!(charged <= price.cost_nanos(prompt_bound, completion_bound),
                "{charged} over the hold for {usage:?}");
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
