//! Alert notices: a balance below a threshold, a key past a share of its
//! limit. What they carry, and the e-mail an account's owner gets.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::email::clean;

/// The webhook `type` of a balance below a threshold.
pub const BALANCE_BELOW_EVENT: &str = "balance.below";
/// The webhook `type` of a key past a share of its limit.
pub const KEY_LIMIT_PERCENT_EVENT: &str = "key.limit_percent";

/// One crossing of an alert threshold, as the account's owner and the
/// alert webhook are told about it. It is also the webhook's `data`,
/// serialised as is (the [`Alert`]'s fields beside the others, credits as
/// JSON numbers, instants in RFC 3339).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertNotice {
    /// The crossing's id: the same on every instance and every attempt, so
    /// a receiver can drop a repeat. Also the webhook's `id`.
    pub id: String,
    /// The account's id.
    pub account: String,
    /// The account owner's address; `None` sends no e-mail (the webhook
    /// still goes).
    pub email: Option<String>,
    /// What was crossed.
    #[serde(flatten)]
    pub alert: Alert,
    /// When the crossing was noticed (after the settlement that made it).
    pub detected_at: DateTime<Utc>,
}

/// What an [`AlertNotice`] reports. Credit amounts are JSON numbers of
/// credits (`4.5`), as the management API shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Alert {
    /// The account's balance fell below `threshold`.
    BalanceBelow {
        /// The threshold crossed, in credits.
        threshold: Value,
        /// The balance when it was noticed, in credits.
        balance: Value,
    },
    /// A key's usage in its limit's period reached `percent` of the limit.
    KeyLimitPercent {
        /// The key's human name.
        key_name: String,
        /// The first 12 hex digits of the key's SHA-256 hash: never the key.
        key_hash_prefix: String,
        /// The share of the limit reached, 1 to 100.
        percent: u8,
        /// The key's usage in the period, in credits.
        usage: Value,
        /// The key's limit, in credits.
        limit: Value,
        /// The limit's period (`daily`, `weekly`, `monthly`, as keys'
        /// `limit_reset`); `None`: the limit never resets.
        period: Option<String>,
        /// When the current period began; `None` without a period.
        period_start: Option<DateTime<Utc>>,
    },
}

impl AlertNotice {
    /// The webhook's `type`: [`BALANCE_BELOW_EVENT`] or
    /// [`KEY_LIMIT_PERCENT_EVENT`].
    pub fn event_type(&self) -> &'static str {
        match self.alert {
            Alert::BalanceBelow { .. } => BALANCE_BELOW_EVENT,
            Alert::KeyLimitPercent { .. } => KEY_LIMIT_PERCENT_EVENT,
        }
    }

    /// The key's hash prefix, for a key's alert.
    pub(super) fn key_hash_prefix(&self) -> &str {
        match &self.alert {
            Alert::BalanceBelow { .. } => "",
            Alert::KeyLimitPercent {
                key_hash_prefix, ..
            } => key_hash_prefix,
        }
    }
}

/// The subject line.
pub(super) fn subject(notice: &AlertNotice) -> String {
    match &notice.alert {
        Alert::BalanceBelow { threshold, .. } => {
            format!("Your modelgate balance is below {threshold} credits")
        }
        Alert::KeyLimitPercent {
            key_name, percent, ..
        } => format!(
            "Your modelgate API key \"{}\" has used {percent}% of its limit",
            clean(key_name, 100)
        ),
    }
}

/// The message text: what was crossed, the figures, and what to do. Every
/// value that could come from a user is cleaned as the leak e-mail's are.
pub(super) fn body(notice: &AlertNotice, settings_page: &str) -> String {
    let account = clean(&notice.account, 200);
    let when = notice.detected_at.format("%Y-%m-%d %H:%M:%S UTC");
    match &notice.alert {
        Alert::BalanceBelow { threshold, balance } => format!(
            "Hello,

The credit balance of your modelgate account {account} has fallen below
{threshold} credits.

  Account:      {account}
  Balance:      {balance} credits
  Alert below:  {threshold} credits
  Noticed at:   {when}

Requests are refused (402) once the balance cannot pay for them. To keep
your programs running, top up the account's credits. Your keys are on the
key settings page ({settings_page}).

You get this message once each time the balance falls below {threshold}
credits: after a top-up, it comes again if the balance falls below it
again.

-- 
modelgate
"
        ),
        Alert::KeyLimitPercent {
            key_name,
            key_hash_prefix,
            percent,
            usage,
            limit,
            period,
            period_start,
        } => {
            let name = clean(key_name, 200);
            let prefix: String = key_hash_prefix
                .chars()
                .take(12)
                .filter(char::is_ascii_hexdigit)
                .collect();
            let (period_text, resets) = match (period.as_deref(), period_start) {
                (Some(period), Some(start)) => (
                    format!(
                        "this {} (since {} UTC)",
                        match period {
                            "daily" => "day".to_owned(),
                            "weekly" => "week".to_owned(),
                            "monthly" => "month".to_owned(),
                            other => clean(other, 20),
                        },
                        start.format("%Y-%m-%d %H:%M")
                    ),
                    "The limit resets at the start of the next period; until then",
                ),
                _ => (
                    "in all (this limit never resets)".to_owned(),
                    "Until the limit is raised",
                ),
            };
            format!(
                "Hello,

Your modelgate API key \"{name}\" (hash prefix {prefix}) of account
{account} has used {percent}% of its credit limit.

  Key:          \"{name}\", hash prefix {prefix}
  Account:      {account}
  Used:         {usage} credits, {period_text}
  Limit:        {limit} credits
  Alert at:     {percent}% of the limit
  Noticed at:   {when}

{resets} requests made with this key are refused (402) once they would go
past it. To raise or lift the limit, edit the key on the key settings page
({settings_page}).

You get this message once per period for each share of the limit; a new
period or a changed limit arms it again.

-- 
modelgate
"
            )
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    pub(crate) fn balance_notice() -> AlertNotice {
        AlertNotice {
            id: "0123456789abcdef0123456789abcdef".into(),
            account: "acct_7".into(),
            email: Some("owner@example.com".into()),
            alert: Alert::BalanceBelow {
                threshold: json!(5),
                balance: json!(4.25),
            },
            detected_at: Utc.with_ymd_and_hms(2025, 3, 1, 12, 30, 5).unwrap(),
        }
    }

    pub(crate) fn key_notice() -> AlertNotice {
        AlertNotice {
            id: "fedcba9876543210fedcba9876543210".into(),
            account: "acct_7".into(),
            email: Some("owner@example.com".into()),
            alert: Alert::KeyLimitPercent {
                key_name: "ci\r\nBcc: x@example.com".into(),
                key_hash_prefix: "3f9a0c1b2d4e".into(),
                percent: 80,
                usage: json!(8.5),
                limit: json!(10),
                period: Some("monthly".into()),
                period_start: Some(Utc.with_ymd_and_hms(2025, 3, 1, 0, 0, 0).unwrap()),
            },
            detected_at: Utc.with_ymd_and_hms(2025, 3, 20, 8, 0, 0).unwrap(),
        }
    }

    #[test]
    fn a_balance_alert_names_the_figures_and_says_to_top_up() {
        let notice = balance_notice();
        assert_eq!(
            subject(&notice),
            "Your modelgate balance is below 5 credits"
        );
        let text = body(&notice, "https://gw.example.com/settings");
        for words in [
            "acct_7",
            "fallen below\n5 credits",
            "Balance:      4.25 credits",
            "2025-03-01 12:30:05 UTC",
            "top up",
            "(https://gw.example.com/settings)",
            "after a top-up",
        ] {
            assert!(text.contains(words), "{words:?} missing from\n{text}");
        }
    }

    #[test]
    fn a_key_alert_names_usage_limit_and_period_and_injects_no_line() {
        let notice = key_notice();
        let text = body(&notice, "/settings");
        for words in [
            "used 80% of its credit limit",
            "Used:         8.5 credits, this month (since 2025-03-01 00:00 UTC)",
            "Limit:        10 credits",
            "hash prefix 3f9a0c1b2d4e",
            "raise or lift the limit",
            "(/settings)",
        ] {
            assert!(text.contains(words), "{words:?} missing from\n{text}");
        }
        assert!(!text.lines().any(|line| line.starts_with("Bcc:")), "{text}");
        assert!(!subject(&notice).contains('\n'));
        let mut forever = notice;
        if let Alert::KeyLimitPercent {
            period,
            period_start,
            ..
        } = &mut forever.alert
        {
            *period = None;
            *period_start = None;
        }
        assert!(body(&forever, "/settings").contains("in all (this limit never resets)"));
    }

    #[test]
    fn the_data_is_flat_and_reads_back() {
        for notice in [balance_notice(), key_notice()] {
            let json = serde_json::to_value(&notice).unwrap();
            assert_eq!(json["account"], "acct_7");
            assert!(json.get("alert").is_none(), "{json}");
            let back: AlertNotice = serde_json::from_value(json).unwrap();
            assert_eq!(back, notice);
        }
        let json = serde_json::to_value(balance_notice()).unwrap();
        assert_eq!(json["threshold"], 5);
        assert_eq!(json["balance"], 4.25);
        assert_eq!(balance_notice().event_type(), "balance.below");
        assert_eq!(key_notice().event_type(), "key.limit_percent");
    }
}
