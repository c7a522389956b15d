//! The quota of free model variants (ids ending in `:free`), from seed 000:
//! at most 20 requests a minute, and per UTC day 50 requests, or 1000 once
//! the account has bought at least 10 credits.
//!
//! [`FreeQuotaRules`] holds those numbers and names the account's counters,
//! so the key status endpoint reports exactly what the quota layer counts.
//!
//! ```
//! use modelgate::free_quota::FreeQuotaRules;
//! use modelgate::store::NANOS_PER_CREDIT;
//!
//! let rules = FreeQuotaRules::default();
//! assert_eq!(rules.requests_per_day_for(0), 50);
//! assert_eq!(rules.requests_per_day_for(10 * NANOS_PER_CREDIT), 1000);
//! ```

use crate::clock::Period;
use crate::store::{Check, Limit, NANOS_PER_CREDIT};

/// The counter of free-model requests in the current UTC day, per account.
pub(crate) const DAILY_COUNTER: &str = "free:day";

/// The limits of free model variants, per account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

impl FreeQuotaRules {
    /// The daily limit of an account that bought `purchased_nanos` in total.
    pub fn requests_per_day_for(&self, purchased_nanos: i64) -> u64 {
        if purchased_nanos >= self.purchase_threshold_nanos {
            self.requests_per_day_after_purchase
        } else {
            self.requests_per_day
        }
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
