//! The rules of GlobalRateLimit, as configured (JSON) and as counter checks.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::body::ModelId;
use crate::error::LimitSource;
use crate::model_id::{check_pattern, pattern_covers};
use crate::store::{Check, Limit};

/// One bound on a request rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RateRule {
    /// GCRA: `requests` per `period_seconds` sustained, up to `burst` at once.
    Gcra {
        /// Sustained requests per period.
        requests: u64,
        /// The period, in seconds.
        period_seconds: u64,
        /// Most requests admitted at once.
        burst: u64,
    },
    /// At most `requests` in any `window_seconds` (an exact sliding log).
    Rolling {
        /// Most requests in any window.
        requests: u64,
        /// The window, in seconds.
        window_seconds: u64,
    },
}

impl RateRule {
    /// The counter limit this rule checks.
    pub fn limit(&self) -> Limit {
        match *self {
            RateRule::Gcra {
                requests,
                period_seconds,
                burst,
            } => Limit::Gcra {
                rate: requests,
                period: Duration::from_secs(period_seconds),
                burst,
            },
            RateRule::Rolling {
                requests,
                window_seconds,
            } => Limit::Rolling {
                limit: requests,
                window: Duration::from_secs(window_seconds),
            },
        }
    }

    /// The rule's kind and window, for its counter's name: rules that
    /// differ in either count apart (10 a minute and 100 an hour on one
    /// pattern are two counters).
    pub(crate) fn counter_name(&self, prefix: &[&str]) -> String {
        let (kind, seconds) = match *self {
            RateRule::Gcra { period_seconds, .. } => ("gcra:", period_seconds),
            RateRule::Rolling { window_seconds, .. } => ("rolling:", window_seconds),
        };
        // Built by hand: every admitted request names its counters.
        let mut name = String::with_capacity(48);
        for part in prefix {
            name.push_str(part);
        }
        name.push_str(kind);
        name.push_str(itoa::Buffer::new().format(seconds));
        name.push('s');
        name
    }

    fn validate(&self) -> Result<(), String> {
        let zero = match *self {
            RateRule::Gcra {
                requests,
                period_seconds,
                burst,
            } => requests == 0 || period_seconds == 0 || burst == 0,
            RateRule::Rolling {
                requests,
                window_seconds,
            } => requests == 0 || window_seconds == 0,
        };
        if zero {
            return Err("every number of a rule must be at least 1".to_owned());
        }
        self.limit().validate().map_err(str::to_owned)
    }
}

impl fmt::Display for RateRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RateRule::Gcra {
                requests,
                period_seconds,
                burst,
            } => write!(
                f,
                "{} per {period_seconds} s, in bursts of at most {burst}",
                requests_text(requests)
            ),
            RateRule::Rolling {
                requests,
                window_seconds,
            } => write!(f, "{} in any {window_seconds} s", requests_text(requests)),
        }
    }
}

fn requests_text(requests: u64) -> String {
    if requests == 1 {
        "1 request".to_owned()
    } else {
        format!("{requests} requests")
    }
}

/// A rule for some models: `match` is a model id (`openai/gpt-4o`, which
/// covers all its variants; `openai/gpt-4o:free`, only that variant) or a
/// provider prefix ending in `/` (`openai/`). Every rule that matches a
/// request applies, each with its own counter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRule {
    /// Which models the rule covers.
    #[serde(rename = "match")]
    pub matches: String,
    /// The bound.
    pub limit: RateRule,
}

impl ModelRule {
    /// Whether the rule covers `model` (ASCII case ignored, as upstreams do).
    pub fn covers(&self, model: &ModelId) -> bool {
        pattern_covers(&self.matches, model)
    }

    fn validate(&self) -> Result<(), String> {
        check_pattern(&self.matches).map_err(|problem| format!("match {problem}"))?;
        self.limit.validate()
    }
}

/// Rules of one account: replace the defaults where given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountRules {
    /// The account-wide rule; `null` for none. Absent: the default's.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "present_or_absent"
    )]
    pub account: Option<Option<RateRule>>,
    /// The per-model rules. Absent: the default's.
    #[serde(default)]
    pub models: Option<Vec<ModelRule>>,
}

/// The rules of GlobalRateLimit. Limits belong to accounts: all keys of
/// an account share every counter, so more keys never raise a limit.
///
/// ```
/// use modelgate::rate_limit::RateLimitRules;
///
/// let rules = RateLimitRules::from_json(r#"{
///     "account": {"gcra": {"requests": 600, "period_seconds": 60, "burst": 60}},
///     "models": [
///         {"match": "openai/gpt-4o", "limit": {"rolling": {"requests": 100, "window_seconds": 60}}},
///         {"match": "anthropic/", "limit": {"gcra": {"requests": 5, "period_seconds": 1, "burst": 10}}}
///     ],
///     "accounts": {"big-customer": {"account": {"gcra": {"requests": 6000, "period_seconds": 60, "burst": 600}}}}
/// }"#).unwrap();
/// assert_eq!(rules.models.len(), 2);
/// assert!(RateLimitRules::from_json(r#"{"account": {"gcra": {"requests": 0, "period_seconds": 1, "burst": 1}}}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitRules {
    /// The account-wide rule every account gets, if any.
    #[serde(default)]
    pub account: Option<RateRule>,
    /// Per-model rules every account gets.
    #[serde(default)]
    pub models: Vec<ModelRule>,
    /// Per-account overrides, by account id.
    #[serde(default)]
    pub accounts: HashMap<String, AccountRules>,
}

/// Why a rules document was refused.
#[derive(Debug, thiserror::Error)]
#[error("rate limit rules: {0}")]
pub struct RulesError(String);

/// A check with what it stands for.
#[derive(Clone, Debug)]
pub(crate) struct RuleCheck {
    pub(crate) check: Check,
    pub(crate) source: LimitSource,
    pub(crate) rule: RateRule,
    /// The model rule's `match`, for the message.
    pub(crate) matches: Option<String>,
}

impl RateLimitRules {
    /// Reads and checks a JSON rules document.
    pub fn from_json(text: &str) -> Result<Self, RulesError> {
        let rules: RateLimitRules =
            serde_json::from_str(text).map_err(|error| RulesError(error.to_string()))?;
        rules.validate()?;
        Ok(rules)
    }

    /// Checks every rule: numbers at least 1 and within what counters hold,
    /// `match` patterns well formed.
    pub fn validate(&self) -> Result<(), RulesError> {
        let defaults = AccountRules {
            account: Some(self.account),
            models: Some(self.models.clone()),
        };
        for (name, rules) in std::iter::once(("default", &defaults))
            .chain(self.accounts.iter().map(|(id, rules)| (id.as_str(), rules)))
        {
            if let Some(Some(rule)) = &rules.account {
                rule.validate()
                    .map_err(|error| RulesError(format!("{name}: account rule: {error}")))?;
            }
            let mut counters = std::collections::HashSet::new();
            for rule in rules.models.iter().flatten() {
                rule.validate().map_err(|error| {
                    RulesError(format!("{name}: model rule {:?}: {error}", rule.matches))
                })?;
                if !counters.insert(model_counter(rule)) {
                    return Err(RulesError(format!(
                        "{name}: two model rules for {:?} with the same kind and window; give one of them another window or merge them",
                        rule.matches
                    )));
                }
            }
        }
        Ok(())
    }

    /// The checks a request of `account` for `model` (if a model call)
    /// makes.
    pub(crate) fn checks_for(&self, account: &str, model: Option<&ModelId>) -> Vec<RuleCheck> {
        let overrides = self.accounts.get(account);
        let account_rule = overrides
            .and_then(|rules| rules.account)
            .unwrap_or(self.account);
        let model_rules = overrides
            .and_then(|rules| rules.models.as_deref())
            .unwrap_or(&self.models);
        let mut checks = Vec::new();
        if let Some(rule) = account_rule {
            checks.push(RuleCheck {
                check: Check::new(rule.counter_name(&["rate:account:"]), rule.limit(), 1),
                source: LimitSource::AccountRate,
                rule,
                matches: None,
            });
        }
        if let Some(model) = model {
            for rule in model_rules.iter().filter(|rule| rule.covers(model)) {
                let name = model_counter(rule);
                // `validate` refuses two rules with one counter; should
                // unvalidated rules arrive, the first one decides.
                if checks.iter().any(|existing| existing.check.name == name) {
                    continue;
                }
                checks.push(RuleCheck {
                    check: Check::new(name, rule.limit.limit(), 1),
                    source: LimitSource::ModelRate,
                    rule: rule.limit,
                    matches: Some(rule.matches.clone()),
                });
            }
        }
        checks
    }
}

/// The counter of a model rule: its pattern, kind and window.
fn model_counter(rule: &ModelRule) -> String {
    let matches = rule.matches.to_ascii_lowercase();
    rule.limit.counter_name(&["rate:model:", &matches, ":"])
}

/// `Option<Option<T>>` for a field where absent and `null` differ.
mod present_or_absent {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<T: Serialize, S: Serializer>(
        value: &Option<Option<T>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(inner) => inner.serialize(serializer),
            None => serializer.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(deserializer).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn model(text: &str) -> ModelId {
        ModelId::parse(text).unwrap()
    }

    fn rolling(requests: u64) -> RateRule {
        RateRule::Rolling {
            requests,
            window_seconds: 60,
        }
    }

    fn rule(matches: &str, requests: u64) -> ModelRule {
        ModelRule {
            matches: matches.into(),
            limit: rolling(requests),
        }
    }

    #[test]
    fn patterns_cover_models_variants_and_providers() {
        let exact = rule("openai/gpt-4o", 1);
        assert!(exact.covers(&model("openai/gpt-4o")));
        assert!(
            exact.covers(&model("OpenAI/GPT-4o:nitro")),
            "no variant or case dodges a rule"
        );
        assert!(!exact.covers(&model("openai/gpt-4o-mini")));
        let variant = rule("openai/gpt-4o:free", 1);
        assert!(variant.covers(&model("openai/gpt-4o:FREE")));
        assert!(!variant.covers(&model("openai/gpt-4o")));
        let provider = rule("openai/", 1);
        assert!(provider.covers(&model("openai/o1:beta")));
        assert!(!provider.covers(&model("openaix/o1")));
    }

    #[test]
    fn every_matching_rule_applies_with_the_account_rule_first() {
        let rules = RateLimitRules {
            account: Some(rolling(100)),
            models: vec![
                rule("openai/", 50),
                rule("openai/gpt-4o", 10),
                rule("anthropic/", 5),
            ],
            accounts: HashMap::new(),
        };
        let checks = rules.checks_for("acct", Some(&model("openai/gpt-4o")));
        let names: Vec<_> = checks
            .iter()
            .map(|check| check.check.name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "rate:account:rolling:60s",
                "rate:model:openai/:rolling:60s",
                "rate:model:openai/gpt-4o:rolling:60s"
            ]
        );
        assert_eq!(checks[0].source, LimitSource::AccountRate);
        assert_eq!(checks[2].source, LimitSource::ModelRate);
        assert_eq!(
            rules.checks_for("acct", None).len(),
            1,
            "no model, no model rules"
        );
    }

    #[test]
    fn two_windows_on_one_pattern_are_two_counters() {
        let rules = RateLimitRules::from_json(
            r#"{"models": [{"match": "a/", "limit": {"rolling": {"requests": 10, "window_seconds": 60}}},
                           {"match": "a/", "limit": {"rolling": {"requests": 3, "window_seconds": 3600}}}]}"#,
        )
        .unwrap();
        let checks = rules.checks_for("acct", Some(&model("a/b")));
        assert_eq!(checks.len(), 2);
        assert_ne!(checks[0].check.name, checks[1].check.name);
    }

    #[test]
    fn account_overrides_replace_only_what_they_name() {
        let rules = RateLimitRules::from_json(
            r#"{"account": {"rolling": {"requests": 10, "window_seconds": 60}},
                "models": [{"match": "openai/", "limit": {"rolling": {"requests": 5, "window_seconds": 60}}}],
                "accounts": {
                    "unlimited": {"account": null},
                    "custom": {"models": []}
                }}"#,
        )
        .unwrap();
        let gpt = model("openai/gpt-4o");
        assert_eq!(rules.checks_for("other", Some(&gpt)).len(), 2);
        let unlimited = rules.checks_for("unlimited", Some(&gpt));
        assert_eq!(unlimited.len(), 1);
        assert_eq!(unlimited[0].source, LimitSource::ModelRate);
        let custom = rules.checks_for("custom", Some(&gpt));
        assert_eq!(custom.len(), 1);
        assert_eq!(custom[0].source, LimitSource::AccountRate);
    }

    #[test]
    fn bad_rules_are_refused_with_where_they_are() {
        for (text, words) in [
            (
                r#"{"account": {"gcra": {"requests": 0, "period_seconds": 1, "burst": 1}}}"#,
                "default: account rule",
            ),
            (
                r#"{"models": [{"match": "gpt-4o", "limit": {"rolling": {"requests": 1, "window_seconds": 1}}}]}"#,
                "neither",
            ),
            (
                r#"{"accounts": {"a": {"models": [{"match": "x/", "limit": {"rolling": {"requests": 1, "window_seconds": 0}}}]}}}"#,
                "a: model rule",
            ),
            (r#"{"account": {"leaky": {}}}"#, "unknown variant"),
            (r#"{"acount": null}"#, "unknown field"),
            (
                r#"{"models": [{"match": "a/", "limit": {"rolling": {"requests": 1, "window_seconds": 60}}},
                            {"match": "A/", "limit": {"rolling": {"requests": 5, "window_seconds": 60}}}]}"#,
                "same kind and window",
            ),
            (
                r#"{"account": {"gcra": {"requests": 1, "period_seconds": 1, "burst": 9007199254740993}}}"#,
                "2^53",
            ),
        ] {
            let error = RateLimitRules::from_json(text).unwrap_err().to_string();
            assert!(error.contains(words), "{text}: {error}");
        }
    }

    proptest! {
        #[test]
        fn no_rules_document_panics(text in "\\PC{0,80}") {
            let _ = RateLimitRules::from_json(&text);
        }

        #[test]
        fn rules_survive_a_json_round_trip(requests in 1u64..1000, seconds in 1u64..3600, burst in 1u64..100) {
            let rules = RateLimitRules {
                account: Some(RateRule::Gcra { requests, period_seconds: seconds, burst }),
                models: vec![rule("openai/", requests)],
                accounts: HashMap::from([("a".to_owned(), AccountRules { account: Some(None), models: None })]),
            };
            let text = serde_json::to_string(&rules).unwrap();
            prop_assert_eq!(RateLimitRules::from_json(&text).unwrap(), rules);
        }
    }
}
