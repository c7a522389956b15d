//! [`ModelCatalog`]: which models the gateway serves (a configured provider
//! and a price), where a request may fall back to, and `GET /api/v1/models`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::body::{ModelId, ModelNames};
use crate::clock::{Clock, SystemClock};
use crate::context::Principal;
use crate::credit::{PriceTable, Pricing, TokenPrice, TokenRates};
use crate::error::{ErrorKind, GatewayError};
use crate::free_quota::FreeQuotaRules;
use crate::json_input::{invalid_parameter, wrong_type};
use crate::rate_limit::RateLimitRules;

/// Most models one request tries: its own and its fallbacks.
pub const MAX_MODELS_PER_REQUEST: usize = 5;

/// What the gateway serves, built once from its configuration.
#[derive(Clone, Debug)]
pub struct ModelCatalog {
    prices: Arc<PriceTable>,
    /// Configured providers (lower case); `None`: one upstream serves every provider.
    providers: Option<HashSet<String>>,
    /// Per model id (lower case), the models to try after it.
    fallbacks: HashMap<String, Vec<ModelId>>,
    models_list: Value,
    /// The listed models' ids by their lower-case form: the only values a
    /// metric's `model` label takes besides `other`.
    listed: HashMap<String, String>,
    /// What a request's `models` may name besides model ids.
    names: ModelNames,
}

impl ModelCatalog {
    /// The catalog of `prices`, served by `providers` (`None`: any
    /// provider), with configured `fallbacks`; the models list shows the
    /// rate `rules` and the free `quota` that apply to each model.
    pub fn new(
        prices: Arc<PriceTable>,
        providers: Option<HashSet<String>>,
        fallbacks: &HashMap<String, Vec<String>>,
        rules: &RateLimitRules,
        quota: &FreeQuotaRules,
    ) -> Result<Self, String> {
        let providers = providers.map(|names| {
            names
                .into_iter()
                .map(|name| name.to_ascii_lowercase())
                .collect()
        });
        let mut catalog = ModelCatalog {
            prices,
            providers,
            fallbacks: HashMap::new(),
            models_list: Value::Null,
            listed: HashMap::new(),
            names: ModelNames::new(),
        };
        for (model, next) in fallbacks {
            let from = ModelId::parse(model)
                .map_err(|_| format!("fallbacks: {model:?} is not a model id"))?;
            let mut parsed = Vec::new();
            for candidate in next {
                let id = ModelId::parse(candidate)
                    .map_err(|_| format!("fallbacks.{model}: {candidate:?} is not a model id"))?;
                catalog
                    .check(&id)
                    .map_err(|error| format!("fallbacks.{model}: {}", error.message()))?;
                parsed.push(id);
            }
            catalog
                .fallbacks
                .insert(from.as_str().to_ascii_lowercase(), parsed);
        }
        catalog.models_list = catalog.list(rules, quota);
        catalog.listed = catalog.models_list["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|model| model["id"].as_str())
            .map(|id| (id.to_ascii_lowercase(), id.to_owned()))
            .collect();
        Ok(catalog)
    }

    /// The catalog with the bare ids and aliases `names` resolves: a
    /// request's `models` may name them as its `model` may, and each model
    /// of the list shows the names that reach it in `aliases`.
    pub fn with_model_names(mut self, names: ModelNames) -> Self {
        if let Some(models) = self.models_list["data"].as_array_mut() {
            for model in models {
                let aliases = model["id"]
                    .as_str()
                    .and_then(|id| ModelId::parse(id).ok())
                    .map(|id| names.names_for(&id))
                    .unwrap_or_default();
                model["aliases"] = json!(aliases);
            }
        }
        self.names = names;
        self
    }

    /// 400 unless the gateway serves `model`: its provider is configured
    /// and it has a price.
    pub fn check(&self, model: &ModelId) -> Result<(), GatewayError> {
        if let Some(providers) = &self.providers
            && !providers.contains(&model.provider().to_ascii_lowercase())
        {
            return Err(GatewayError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "no provider {:?} is configured on this gateway (model {model}); \
                         GET /api/v1/models lists the models it serves",
                    model.provider()
                ),
            )
            .with_metadata("param", "model"));
        }
        if self.prices.price(model).is_none() {
            let problem = if model.is_free() {
                "is not a free model this gateway serves"
            } else {
                "has no price on this gateway"
            };
            return Err(GatewayError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "the model {model} {problem}; \
                     GET /api/v1/models lists the models it serves"
                ),
            )
            .with_metadata("param", "model"));
        }
        Ok(())
    }

    /// The models a request tries, in order: its `model`, then its
    /// `models` list (as OpenRouter clients send it), then the configured
    /// fallbacks of its model; each once, at most
    /// [`MAX_MODELS_PER_REQUEST`]. 400 for a model not served or a
    /// malformed `models`.
    pub fn candidates(
        &self,
        model_id: &ModelId,
        models: Option<&Value>,
    ) -> Result<Vec<ModelId>, GatewayError> {
        self.check(model_id)?;
        let mut candidates = vec![model_id.clone()];
        let push = |candidates: &mut Vec<ModelId>, id: ModelId| {
            if candidates.len() < MAX_MODELS_PER_REQUEST
                && !candidates
                    .iter()
                    .any(|seen| seen.as_str().eq_ignore_ascii_case(id.as_str()))
            {
                candidates.push(id);
            }
        };
        match models {
            None | Some(Value::Null) => {}
            Some(Value::Array(models)) if models.len() <= MAX_MODELS_PER_REQUEST => {
                for (index, model) in models.iter().enumerate() {
                    let param = format!("models[{index}]");
                    let text = model
                        .as_str()
                        .ok_or_else(|| wrong_type(&param, "a model id string", model))?;
                    let id = self
                        .names
                        .resolve(text)
                        .map_err(|error| error.with_metadata("param", param.clone()))?;
                    self.check(&id)
                        .map_err(|error| error.with_metadata("param", param.clone()))?;
                    let new = !candidates
                        .iter()
                        .any(|seen| seen.as_str().eq_ignore_ascii_case(id.as_str()));
                    if new && candidates.len() == MAX_MODELS_PER_REQUEST {
                        return Err(invalid_parameter(
                            "models",
                            format!(
                                "a request names at most {MAX_MODELS_PER_REQUEST} models in all, \
                                 `model` and `models` together"
                            ),
                        ));
                    }
                    push(&mut candidates, id);
                }
            }
            // Too many, or not a list: a value out of range or of the
            // wrong type, as for any other parameter.
            Some(other) => {
                let expected = format!(
                    "an array of at most {MAX_MODELS_PER_REQUEST} model ids, tried in order"
                );
                return Err(if other.is_array() {
                    invalid_parameter("models", format!("`models` must be {expected}"))
                } else {
                    wrong_type("models", &expected, other)
                });
            }
        }
        if let Some(configured) = self.fallbacks.get(&model_id.as_str().to_ascii_lowercase()) {
            for id in configured {
                push(&mut candidates, id.clone());
            }
        }
        Ok(candidates)
    }

    /// What a metric's `model` label says for `model`: its id as
    /// `GET /api/v1/models` lists it, or `other` for anything else a
    /// request may name (a variant priced by its base, a model under a
    /// `default` price), so that clients cannot create series by inventing
    /// names.
    pub fn metric_label<'a>(&'a self, model: &str) -> &'a str {
        self.listed
            .get(&model.to_ascii_lowercase())
            .map_or("other", String::as_str)
    }

    /// `GET /api/v1/models`: the OpenAI list shape, each model with its
    /// prices (credits per million tokens, and per token as OpenRouter
    /// gives them), its rate rules, its free quota and its fallbacks.
    pub fn models_list(&self) -> &Value {
        &self.models_list
    }

    fn list(&self, rules: &RateLimitRules, quota: &FreeQuotaRules) -> Value {
        // The list is built once, when the gateway starts: its `created`
        // is that moment, on the system clock.
        let created = SystemClock.now().timestamp();
        // Every model the table names and the gateway serves, the `:free`
        // variants it names among them.
        let data: Vec<Value> = self
            .prices
            .models()
            .into_iter()
            .filter_map(|(id, _)| {
                let model = ModelId::parse(id).ok()?;
                if self.check(&model).is_err() {
                    return None;
                }
                // The price charged, not the one stored: `:free` is free.
                let price = self.prices.price(&model)?;
                let model_rules: Vec<&crate::rate_limit::ModelRule> = rules
                    .models
                    .iter()
                    .filter(|rule| rule.covers(&model))
                    .collect();
                let fallbacks: Vec<&str> = self
                    .fallbacks
                    .get(id)
                    .map(|next| next.iter().map(ModelId::as_str).collect())
                    .unwrap_or_default();
                Some(json!({
                    "id": model.as_str(),
                    "object": "model",
                    "created": created,
                    "owned_by": model.provider(),
                    // As OpenRouter gives it; null when the pricing sets none.
                    "context_length": self.prices.prompt_bounds(&model).context_length_tokens,
                    "pricing": pricing_json(&price),
                    // The routes that call it: an embeddings model is
                    // called on its own route, the others on the rest
                    // (translated where their provider serves another).
                    "supported_apis": match price.embeddings_only {
                        true => json!(["embeddings"]),
                        false => json!(["chat", "messages", "responses"]),
                    },
                    "limits": {
                        "account_rate": rules.account,
                        "model_rates": model_rules,
                        "free_quota": model.is_free().then_some(quota),
                    },
                    "fallbacks": fallbacks,
                    // The bare ids and aliases that name it (`with_model_names`).
                    "aliases": [],
                }))
            })
            .collect();
        json!({"object": "list", "data": data})
    }
}

/// A price as OpenRouter's models list gives it: credits per token as
/// decimal strings (`prompt`, `completion`, and the cache and reasoning
/// rates a price sets apart), credits per request and per web search when
/// charged, the two main rates per million as this gateway's config
/// writes them, and `overrides` past a prompt size.
fn pricing_json(price: &TokenPrice) -> Value {
    let per_token = |nanos: i64| Value::from(decimal(nanos, 15));
    let rates_json = |rates: &TokenRates| {
        let mut out = serde_json::Map::new();
        out.insert(
            "prompt".into(),
            per_token(rates.prompt_nanos_per_million_tokens),
        );
        out.insert(
            "completion".into(),
            per_token(rates.completion_nanos_per_million_tokens),
        );
        for (name, rate) in [
            (
                "input_cache_read",
                rates.cache_read_nanos_per_million_tokens,
            ),
            (
                "input_cache_write",
                rates.cache_write_nanos_per_million_tokens,
            ),
            (
                "input_cache_write_1h",
                rates.cache_write_1h_nanos_per_million_tokens,
            ),
            (
                "internal_reasoning",
                rates.reasoning_nanos_per_million_tokens,
            ),
        ] {
            if let Some(rate) = rate {
                out.insert(name.into(), per_token(rate));
            }
        }
        out
    };
    let mut pricing = rates_json(&price.rates);
    for (name, nanos) in [
        ("request", price.request_nanos),
        ("web_search", price.web_search_nanos),
    ] {
        if nanos > 0 {
            pricing.insert(name.into(), Value::from(decimal(nanos, 9)));
        }
    }
    pricing.insert(
        "prompt_per_million".into(),
        Value::from(decimal(price.rates.prompt_nanos_per_million_tokens, 9)),
    );
    pricing.insert(
        "completion_per_million".into(),
        Value::from(decimal(price.rates.completion_nanos_per_million_tokens, 9)),
    );
    let overrides: Vec<Value> = price
        .overrides
        .iter()
        .flatten()
        .map(|tier| {
            let mut out = rates_json(&tier.rates);
            out.insert(
                "min_prompt_tokens".into(),
                Value::from(tier.min_prompt_tokens),
            );
            Value::Object(out)
        })
        .collect();
    if !overrides.is_empty() {
        pricing.insert("overrides".into(), Value::from(overrides));
    }
    Value::Object(pricing)
}

/// The models list in the shape of Anthropic's `GET /v1/models`, for a
/// client that sends `anthropic-version` (Claude Code discovering a
/// gateway's models): `type: "model"`, `id`, `display_name`, `created_at`
/// (RFC 3339), one page (`has_more: false`, `first_id`, `last_id`).
pub(crate) fn anthropic_list(list: &Value) -> Value {
    let models: Vec<Value> = list["data"]
        .as_array()
        .map(|models| {
            models
                .iter()
                .map(|model| {
                    let created_at = model["created"]
                        .as_i64()
                        .and_then(|seconds| chrono::DateTime::from_timestamp(seconds, 0))
                        .unwrap_or_default()
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                    json!({
                        "type": "model",
                        "id": model["id"],
                        "display_name": model["id"],
                        "created_at": created_at,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "first_id": models.first().map(|model| model["id"].clone()),
        "last_id": models.last().map(|model| model["id"].clone()),
        "has_more": false,
        "data": models,
    })
}

/// The models list with only the models `key` may call.
pub(crate) fn callable_by(list: &Value, key: &Principal) -> Value {
    let mut list = list.clone();
    if let Some(Value::Array(models)) = list.get_mut("data") {
        let callable = |id: &Value| {
            id.as_str()
                .and_then(|id| ModelId::parse(id).ok())
                .is_some_and(|id| key.may_call(&id))
        };
        models.retain(|model| callable(&model["id"]));
        // Fallbacks it may not call are never tried for it.
        for model in models.iter_mut() {
            if let Some(Value::Array(fallbacks)) = model.get_mut("fallbacks") {
                fallbacks.retain(callable);
            }
        }
    }
    list
}

/// `units` / 10^`scale` as an exact decimal string: prices are nano-credits
/// per million tokens, so scale 9 gives credits per million tokens and 15
/// credits per token.
fn decimal(units: i64, scale: u32) -> String {
    let divisor = 10_u128.pow(scale);
    let magnitude = u128::from(units.unsigned_abs());
    let sign = if units < 0 { "-" } else { "" };
    let fraction = format!("{:0width$}", magnitude % divisor, width = scale as usize);
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() {
        format!("{sign}{}", magnitude / divisor)
    } else {
        format!("{sign}{}.{fraction}", magnitude / divisor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::ChatRequest;
    use crate::credit::TokenPrice;

    fn catalog(providers: Option<&[&str]>) -> ModelCatalog {
        let prices = PriceTable::from_json(
            r#"{"models": {"openai/gpt-4o": {"prompt_per_million": 2.5, "completion_per_million": 10,
                                            "context_length": 128000},
                           "acme/big": {"prompt_per_million": 1, "completion_per_million": 2}},
                "free_models": ["acme/big:free"]}"#,
        )
        .unwrap();
        let fallbacks = HashMap::from([("openai/gpt-4o".to_owned(), vec!["acme/big".to_owned()])]);
        ModelCatalog::new(
            Arc::new(prices),
            providers.map(|names| names.iter().map(|name| name.to_string()).collect()),
            &fallbacks,
            &RateLimitRules::from_json(
                r#"{"models": [{"match": "openai/", "limit": {"rolling": {"requests": 5, "window_seconds": 60}}}]}"#,
            )
            .unwrap(),
            &FreeQuotaRules::default(),
        )
        .unwrap()
    }

    fn chat(body: Value) -> ChatRequest {
        ChatRequest::parse(body.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn metric_labels_are_listed_ids_or_other() {
        let catalog = catalog(None);
        assert_eq!(catalog.metric_label("openai/gpt-4o"), "openai/gpt-4o");
        assert_eq!(catalog.metric_label("OpenAI/GPT-4o"), "openai/gpt-4o");
        assert_eq!(catalog.metric_label("acme/big"), "acme/big");
        assert_eq!(catalog.metric_label("acme/big:FREE"), "acme/big:free");
        // Served but not listed (variants priced by their base), and
        // inventions.
        assert_eq!(catalog.metric_label("openai/gpt-4o:free"), "other");
        assert_eq!(catalog.metric_label("openai/gpt-4o:nitro"), "other");
        assert_eq!(catalog.metric_label("x/invented-7"), "other");
    }

    #[test]
    fn candidates_are_the_model_then_the_request_list_then_the_configured_fallbacks() {
        let catalog = catalog(Some(&["openai", "acme"]));
        let request = chat(
            json!({"model": "openai/gpt-4o", "models": ["acme/big:free", "OPENAI/GPT-4O"],
            "messages": [{"role": "user", "content": "x"}]}),
        );
        let ids: Vec<String> = catalog
            .candidates(&request.model_id, request.extra.get("models"))
            .unwrap()
            .iter()
            .map(|id| id.as_str().to_owned())
            .collect();
        assert_eq!(ids, ["openai/gpt-4o", "acme/big:free", "acme/big"]);
    }

    #[test]
    fn a_request_names_at_most_five_models_counting_its_model_and_repeats_once() {
        let catalog = catalog(None);
        let five = [
            "acme/big",
            "acme/big:free",
            "openai/gpt-4o:nitro",
            "acme/big:nitro",
        ];
        let mut models: Vec<&str> = five.to_vec();
        // Repeats of a model, its own model among them, count once.
        models.push("OPENAI/GPT-4O");
        let accepted = chat(json!({"model": "openai/gpt-4o", "models": models,
            "messages": [{"role": "user", "content": "x"}]}));
        assert_eq!(
            catalog
                .candidates(&accepted.model_id, accepted.extra.get("models"))
                .unwrap()
                .len(),
            5
        );
        let mut six = five.to_vec();
        six.push("openai/gpt-4o:floor");
        let refused = chat(json!({"model": "openai/gpt-4o", "models": six,
            "messages": [{"role": "user", "content": "x"}]}));
        let error = catalog
            .candidates(&refused.model_id, refused.extra.get("models"))
            .unwrap_err();
        assert_eq!(error.status(), 422);
        assert_eq!(error.to_json()["error"]["metadata"]["param"], "models");
        assert!(
            error.message().contains("at most 5 models in all"),
            "{}",
            error.message()
        );
    }

    #[test]
    fn models_not_served_are_400_and_a_malformed_list_422_naming_the_field() {
        let served = catalog(Some(&["openai", "acme"]));
        for (body, status, param, words) in [
            (
                json!({"model": "nobody/x"}),
                400,
                "model",
                "no provider \"nobody\"",
            ),
            (json!({"model": "openai/o1"}), 400, "model", "has no price"),
            (
                json!({"model": "openai/gpt-4o", "models": ["acme/none"]}),
                400,
                "models[0]",
                "has no price",
            ),
            // Of the wrong type or out of range: 422, as for any parameter.
            (
                json!({"model": "openai/gpt-4o", "models": [3]}),
                422,
                "models[0]",
                "must be a model id string, not a number",
            ),
            (
                json!({"model": "openai/gpt-4o", "models": "acme/big"}),
                422,
                "models",
                "an array",
            ),
            (
                json!({"model": "openai/gpt-4o", "models": ["a/1", "a/2", "a/3", "a/4", "a/5", "a/6"]}),
                422,
                "models",
                "at most 5",
            ),
        ] {
            let mut body = body;
            body["messages"] = json!([{"role": "user", "content": "x"}]);
            let error = served
                .candidates(
                    &chat(body.clone()).model_id,
                    chat(body.clone()).extra.get("models"),
                )
                .unwrap_err();
            assert_eq!(error.status(), status, "{body}");
            assert!(
                error.message().contains(words),
                "{body}: {}",
                error.message()
            );
            assert_eq!(
                error.to_json()["error"]["metadata"]["param"],
                param,
                "{body}"
            );
            if param == "model" {
                assert!(error.message().contains("GET /api/v1/models"));
            }
        }
        // Without configured providers any provider goes to the one upstream.
        assert!(
            catalog(None)
                .check(&ModelId::parse("acme/big").unwrap())
                .is_ok()
        );
    }

    #[test]
    fn the_models_list_has_the_openai_shape_with_prices_and_limits() {
        let list = catalog(Some(&["openai", "acme"])).models_list().clone();
        assert_eq!(list["object"], "list");
        let gpt = list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|model| model["id"] == "openai/gpt-4o")
            .unwrap();
        assert_eq!(gpt["object"], "model");
        assert_eq!(gpt["owned_by"], "openai");
        assert!(gpt["created"].is_i64());
        assert_eq!(gpt["pricing"]["prompt_per_million"], "2.5");
        assert_eq!(gpt["pricing"]["prompt"], "0.0000025");
        assert_eq!(gpt["pricing"]["completion"], "0.00001");
        assert_eq!(gpt["context_length"], 128_000);
        assert_eq!(gpt["limits"]["model_rates"][0]["match"], "openai/");
        assert_eq!(gpt["fallbacks"], json!(["acme/big"]));
        // A provider that is not configured hides its models.
        let prices = PriceTable::from_json(
            r#"{"models": {"openai/gpt-4o": {"prompt_per_million": 1, "completion_per_million": 1},
                           "acme/big": {"prompt_per_million": 1, "completion_per_million": 2}}}"#,
        )
        .unwrap();
        let only_openai = ModelCatalog::new(
            Arc::new(prices),
            Some(HashSet::from(["OpenAI".to_owned()])),
            &HashMap::new(),
            &RateLimitRules::default(),
            &FreeQuotaRules::default(),
        )
        .unwrap();
        let ids: Vec<&Value> = only_openai.models_list()["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|model| &model["id"])
            .collect();
        assert_eq!(ids, [&json!("openai/gpt-4o")]);
        // A fallback the gateway cannot serve is a configuration error.
        assert!(
            ModelCatalog::new(
                Arc::new(PriceTable::default()),
                Some(HashSet::new()),
                &HashMap::from([("a/b".to_owned(), vec!["c/d".to_owned()])]),
                &RateLimitRules::default(),
                &FreeQuotaRules::default()
            )
            .is_err()
        );
    }

    #[test]
    fn the_models_list_shows_the_free_variants_it_serves_with_their_quota() {
        let prices = PriceTable::from_json(
            r#"{"models": {"openai/gpt-4o": {"prompt_per_million": 2.5, "completion_per_million": 10},
                           "openai/gpt-4o:extended": {"prompt_per_million": 6, "completion_per_million": 18},
                           "meta/llama:free": {"prompt_per_million": 0, "completion_per_million": 0},
                           "acme/big": {"prompt_per_million": 1, "completion_per_million": 2}},
                "free_models": ["openai/gpt-4o-mini:free", "acme/big:free"]}"#,
        )
        .unwrap();
        let quota = FreeQuotaRules::default();
        let catalog = ModelCatalog::new(
            Arc::new(prices),
            Some(HashSet::from(["openai".to_owned(), "meta".to_owned()])),
            &HashMap::new(),
            &RateLimitRules::default(),
            &quota,
        )
        .unwrap();
        let data = catalog.models_list()["data"].as_array().unwrap().clone();
        let ids: Vec<&str> = data
            .iter()
            .map(|model| model["id"].as_str().unwrap())
            .collect();
        // acme is not configured: neither its model nor its free variant;
        // gpt-4o has no free variant, gpt-4o-mini only its free one.
        assert_eq!(
            ids,
            [
                "meta/llama:free",
                "openai/gpt-4o",
                "openai/gpt-4o-mini:free",
                "openai/gpt-4o:extended"
            ]
        );
        for model in &data {
            if model["id"].as_str().unwrap().ends_with(":free") {
                assert_eq!(model["pricing"]["prompt"], "0", "{model}");
                assert_eq!(model["pricing"]["completion_per_million"], "0");
                assert_eq!(model["limits"]["free_quota"], json!(quota), "{model}");
            } else {
                assert!(model["limits"]["free_quota"].is_null(), "{model}");
                assert_ne!(model["pricing"]["prompt"], "0", "{model}");
            }
        }
        // What is listed is served, for free; a free variant not listed is
        // refused, naming the list.
        for id in ids.iter().filter(|id| id.ends_with(":free")) {
            let model = ModelId::parse(id).unwrap();
            assert!(catalog.check(&model).is_ok(), "{id}");
            assert_eq!(catalog.prices.price(&model), Some(TokenPrice::FREE));
        }
        let unnamed = catalog
            .check(&ModelId::parse("openai/gpt-4o:free").unwrap())
            .unwrap_err();
        assert_eq!(unnamed.status(), 400);
        assert!(
            unnamed
                .message()
                .contains("not a free model this gateway serves"),
            "{}",
            unnamed.message()
        );
    }

    #[test]
    fn decimals_are_exact() {
        assert_eq!(decimal(2_500_000_000, 9), "2.5");
        assert_eq!(decimal(2_500_000_000, 15), "0.0000025");
        assert_eq!(decimal(0, 15), "0");
        assert_eq!(decimal(-1, 9), "-0.000000001");
        assert_eq!(decimal(i64::MIN, 9), "-9223372036.854775808");
    }
}
