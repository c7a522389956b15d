//! [`FreeQuotaRules`]: the per-minute and per-day limits of `:free`
//! models, and the counter checks they make.

use std::time::Duration;

use crate::clock::Period;
use crate::store::{Check, Limit, NANOS_PER_CREDIT};

/// The counter of free-model requests in the current UTC day, per account.
const DAILY_COUNTER: &str = "free:day";
/// The counter of free-model requests in any minute, per account.
const MINUTE_COUNTER: &str = "free:minute";

/// The limits of free model variants, per account. In JSON config every
/// field is optional and defaults to the seed's number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FreeQuotaRules {
    /// Requests in any rolling minute.
    pub requests_per_minute: u64,
    /// Requests per UTC day while less than the threshold was purchased.
    pub requests_per_day: u64,
    /// Requests per UTC day once the threshold was purchased.
    pub requests_per_day_after_purchase: u64,
    /// Credits (in nano-credits) an account must have bought, in total, for
    /// the higher daily limit.
    pub purchase_threshold_nanos: i64,
}

impl Default for FreeQuotaRules {
    /// The seed's numbers: 20 a minute; 50 a day, 1000 after 10 credits bought.
    fn default() -> Self {
        FreeQuotaRules {
            requests_per_minute: 20,
            requests_per_day: 50,
            requests_per_day_after_purchase: 1000,
            purchase_threshold_nanos: 10 * NANOS_PER_CREDIT,
        }
    }
}

/// Why free-quota rules were refused.
#[derive(Debug, thiserror::Error)]
#[error("free quota rules: {0}")]
pub struct QuotaRulesError(&'static str);

impl FreeQuotaRules {
    /// Checks the numbers: every limit from 1 to 2^53 (what counters hold),
    /// the threshold not negative.
    pub fn validate(&self) -> Result<(), QuotaRulesError> {
        let limits = [
            self.requests_per_minute,
            self.requests_per_day,
            self.requests_per_day_after_purchase,
        ];
        if limits
            .iter()
            .any(|limit| *limit == 0 || *limit > crate::store::MAX_EXACT)
        {
            return Err(QuotaRulesError(
                "every limit must be from 1 to 2^53 requests",
            ));
        }
        if self.purchase_threshold_nanos < 0 {
            return Err(QuotaRulesError(
                "the purchase threshold must not be negative",
            ));
        }
        Ok(())
    }

    /// The daily limit of an account that bought `purchased_nanos` in total.
    pub fn requests_per_day_for(&self, purchased_nanos: i64) -> u64 {
        if purchased_nanos >= self.purchase_threshold_nanos {
            self.requests_per_day_after_purchase
        } else {
            self.requests_per_day
        }
    }

    /// The per-minute counter's check; `requests` 0 only reads it.
    pub fn minute_check(&self, requests: u64) -> Check {
        Check::new(
            MINUTE_COUNTER,
            Limit::Rolling {
                limit: self.requests_per_minute,
                window: Duration::from_secs(60),
            },
            requests,
        )
    }

    /// The daily counter's check; `requests` 0 only reads it.
    pub fn daily_check(&self, purchased_nanos: i64, requests: u64) -> Check {
        Check::new(
            DAILY_COUNTER,
            Limit::Calendar {
                limit: self.requests_per_day_for(purchased_nanos),
                period: Period::Day,
            },
            requests,
        )
    }
}
