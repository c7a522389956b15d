//! What the store keeps about keys and accounts.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::key::KeyHash;
use crate::clock::Period;
use crate::store::KeyLimit;

/// The collection of tombstones: a deleted key's hash stays here so the
/// key is answered "deleted", not "unknown".
pub const DELETED_KEYS: &str = "deleted_keys";

/// The account new keys belong to when none is named.
pub const DEFAULT_ACCOUNT: &str = "default";

/// The account every operator's key ([`KeyRecord::is_operator`]) is
/// recorded on: no tenant's. Its `:` is outside what an account id may
/// hold ([`is_valid_account_id`]), so no account can ever take it, and no
/// account's management key can name, list or reach its keys.
pub const OPERATOR_ACCOUNT: &str = ":operator";

/// The collection of the one record saying the store's first operator's
/// key was made ([`KeyDirectory::mint_operator_key`]): written only where
/// absent, so of the proxies that start at once on an empty store one
/// makes a key and the others none.
///
/// [`KeyDirectory::mint_operator_key`]: super::KeyDirectory::mint_operator_key
pub const OPERATOR_KEY_MINTED: &str = "operator_key_minted";

/// Longest account id and key name accepted.
pub const MAX_ACCOUNT_ID_CHARS: usize = 64;
/// Longest key name accepted.
pub const MAX_KEY_NAME_CHARS: usize = 256;

/// One API key as stored, under the hex SHA-256 hash of its plaintext.
///
/// `Debug` shows every field; the hashes print as [`KeyHash`]'s own
/// `Debug` does, redacted, as every type holding a key or its hash does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// SHA-256 of the plaintext key; the key's id (stored as its
    /// [hex](KeyHash::to_hex)).
    #[serde(with = "hex_key_hash")]
    pub hash: KeyHash,
    /// The name given at creation (the `label` of the key status endpoint).
    pub name: String,
    /// The account whose balance and rate limits the key shares.
    pub account: String,
    /// Whether the key may use the management API (and may not call models).
    pub management: bool,
    /// A management key that manages its own account only (its keys, its
    /// provider keys, its balance and usage). A management key without it
    /// is the operator's: every account.
    #[serde(default)]
    pub scoped_to_account: bool,
    /// A disabled key is refused with 401 until enabled again.
    pub disabled: bool,
    /// Whether the operator disabled it (or a disable of a key it succeeds
    /// reached it): then only the operator enables it again, never an
    /// account's management key.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled_by_operator: bool,
    /// Credit limit in nano-credits; `None` means no limit.
    pub limit_nanos: Option<i64>,
    /// When usage counted against the limit starts again; `None` never.
    pub limit_reset: Option<Period>,
    /// Whether usage through the account's own provider keys counts.
    pub include_byok_in_limit: bool,
    /// When the key was created.
    pub created_at: DateTime<Utc>,
    /// When the key was last changed.
    pub updated_at: Option<DateTime<Utc>>,
    /// From this instant on the key is refused with 401.
    pub expires_at: Option<DateTime<Utc>>,
    /// When the key was last used, to the minute at best: written at most
    /// once a minute, so a key in use may show up to a minute late.
    #[serde(default)]
    pub last_used_at: Option<DateTime<Utc>>,
    /// Set once the key was reported leaked: it is disabled for good and
    /// refused with 401 `leaked_key`.
    #[serde(default)]
    pub leak: Option<LeakReport>,
    /// The key's [hint](crate::keys::ApiKey::hint), to tell keys apart;
    /// none for a key recorded before hints were kept.
    #[serde(default)]
    pub hint: Option<String>,
    /// The hash of the key that replaced this one
    /// ([`KeyDirectory::rotate_key`](super::KeyDirectory::rotate_key)):
    /// this key then works until its grace ends (its `expires_at`) and is
    /// refused with 401 `rotated_key` from then on.
    #[serde(default, with = "hex_key_hash::optional")]
    pub rotated_to: Option<KeyHash>,
    /// The models the key may call: exact model ids (`openai/gpt-4o`,
    /// `openai/gpt-4o:free`; spelled exactly, case included) or provider prefixes
    /// (`anthropic/`). `None`: every model. Others are refused with 403
    /// `model_not_allowed` by [`GlobalRateLimit`](crate::rate_limit::GlobalRateLimit),
    /// which a stack needs for this and for `rate_limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_models: Option<Vec<String>>,
    /// The key's own request rate, checked with the account's rules in
    /// the same admission step; past it 429 with `limit_source: "key"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<KeyRateLimit>,
}

/// A key's own request rate: at most `requests` in any `window_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRateLimit {
    /// Most requests in any window.
    pub requests: u64,
    /// The window, in seconds.
    pub window_seconds: u64,
}

/// Most entries of a key's `allowed_models`.
pub const MAX_ALLOWED_MODELS: usize = 100;

/// Where and when a key was reported leaked, and by whom.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakReport {
    /// When the report reached the gateway.
    pub reported_at: DateTime<Utc>,
    /// Who reported it: `secret_scanning` (a code host's alert),
    /// `operator`, or `manager:` and the first 8 hex digits of the hash of
    /// the account's management key that reported it.
    pub reported_by: String,
    /// Where it was found (a URL), when the report said.
    #[serde(default)]
    pub url: Option<String>,
    /// What kind of place (`content`, `commit`, `npm`, …), when the report said.
    #[serde(default)]
    pub source: Option<String>,
}

/// A [`KeyHash`] as stored records hold it: its 64 lowercase hex digits,
/// the key's id in the store.
mod hex_key_hash {
    use serde::{Deserialize, Deserializer, Serializer, de};

    use super::KeyHash;

    pub(super) fn serialize<S: Serializer>(
        hash: &KeyHash,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&hash.to_hex())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<KeyHash, D::Error> {
        let hex = String::deserialize(deserializer)?;
        KeyHash::from_hex(&hex)
            .ok_or_else(|| de::Error::custom("a key hash must be 64 lowercase hex digits"))
    }

    /// The same for an optional hash (`null` when absent).
    pub(super) mod optional {
        use serde::{Deserialize, Deserializer, Serializer};

        use super::KeyHash;

        pub(in super::super) fn serialize<S: Serializer>(
            hash: &Option<KeyHash>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            match hash {
                Some(hash) => serializer.serialize_some(&hash.to_hex()),
                None => serializer.serialize_none(),
            }
        }

        pub(in super::super) fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<KeyHash>, D::Error> {
            #[derive(Deserialize)]
            struct Hex(#[serde(deserialize_with = "super::deserialize")] KeyHash);
            Ok(Option::<Hex>::deserialize(deserializer)?.map(|Hex(hash)| hash))
        }
    }
}

impl KeyRecord {
    /// The limit as the ledger checks it, if the key has one.
    pub fn key_limit(&self) -> Option<KeyLimit> {
        self.limit_nanos.map(|limit_nanos| KeyLimit {
            limit_nanos,
            reset: self.limit_reset,
            include_byok: self.include_byok_in_limit,
        })
    }

    /// Whether this is an operator's key: management over every account.
    pub fn is_operator(&self) -> bool {
        self.management && !self.scoped_to_account
    }

    /// Whether the key is one of `account`'s: never for an operator's key,
    /// which belongs to no tenant account, even on a store that still
    /// records it on one (written before [`OPERATOR_ACCOUNT`]).
    pub fn belongs_to(&self, account: &str) -> bool {
        self.account == account && !self.is_operator()
    }

    /// Whether the key has expired at `now`.
    pub fn is_expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|expires_at| expires_at <= now)
    }
}

/// A deleted key's tombstone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedKey {
    /// The account the key belonged to.
    pub account: String,
    /// When it was deleted.
    pub deleted_at: DateTime<Utc>,
}

/// An account: the owner of keys, balance and account-wide limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountRecord {
    /// The account's id.
    pub id: String,
    /// Its name for people; empty for an account made by its first key.
    #[serde(default)]
    pub name: String,
    /// Where its owner is reached (leaked-key notices); `None` when unknown.
    #[serde(default)]
    pub email: Option<String>,
    /// When the account was created or first used.
    pub created_at: DateTime<Utc>,
}

/// What a new account is created with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewAccount {
    /// Its id: 1 to 64 characters of `A-Z a-z 0-9 . _ -`.
    pub id: String,
    /// Its name for people.
    pub name: String,
    /// Its owner's e-mail address.
    pub email: Option<String>,
}

/// What a new key is created with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewKey {
    /// The key's name; required, shown as its label.
    pub name: String,
    /// The owning account, which must exist ([`DEFAULT_ACCOUNT`] is made
    /// on first use). An operator's key (`management` without
    /// `scoped_to_account`) is recorded on [`OPERATOR_ACCOUNT`] whatever
    /// this says.
    pub account: String,
    /// A management key may use the management API and may not call models.
    pub management: bool,
    /// With `management`: the key manages `account` only.
    pub scoped_to_account: bool,
    /// Credit limit in nano-credits; `None` means no limit.
    pub limit_nanos: Option<i64>,
    /// When usage counted against the limit starts again.
    pub limit_reset: Option<Period>,
    /// Whether usage through the account's own provider keys counts.
    pub include_byok_in_limit: bool,
    /// When the key stops working.
    pub expires_at: Option<DateTime<Utc>>,
    /// The models it may call; `None`: every model.
    pub allowed_models: Option<Vec<String>>,
    /// Its own request rate, if any.
    pub rate_limit: Option<KeyRateLimit>,
}

impl NewKey {
    /// A key named `name` on the default account, with no limit.
    pub fn named(name: impl Into<String>) -> Self {
        NewKey {
            name: name.into(),
            account: DEFAULT_ACCOUNT.to_owned(),
            management: false,
            scoped_to_account: false,
            limit_nanos: None,
            limit_reset: None,
            include_byok_in_limit: false,
            expires_at: None,
            allowed_models: None,
            rate_limit: None,
        }
    }
}

/// A change to a key; `None` fields stay as they are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyUpdate {
    /// A new name.
    pub name: Option<String>,
    /// Disable or enable the key.
    pub disabled: Option<bool>,
    /// A new limit: `Some(None)` removes it.
    pub limit_nanos: Option<Option<i64>>,
    /// A new reset period: `Some(None)` makes the limit never reset.
    pub limit_reset: Option<Option<Period>>,
    /// Whether usage through the account's own provider keys counts.
    pub include_byok_in_limit: Option<bool>,
    /// A new expiry: `Some(None)` makes the key never expire.
    pub expires_at: Option<Option<DateTime<Utc>>>,
    /// A new model list: `Some(None)` allows every model.
    pub allowed_models: Option<Option<Vec<String>>>,
    /// A new rate: `Some(None)` removes the key's own rate.
    pub rate_limit: Option<Option<KeyRateLimit>>,
}

impl KeyUpdate {
    /// Applies the change, made by the operator when `by_operator`, else by
    /// an account's management key.
    pub(crate) fn apply(&self, record: &mut KeyRecord, now: DateTime<Utc>, by_operator: bool) {
        if let Some(name) = &self.name {
            record.name = name.clone();
        }
        match self.disabled {
            Some(true) => disable(record, by_operator),
            // A leaked key stays disabled, whatever a change asks; one the
            // operator disabled, unless the operator asks.
            Some(false)
                if record.leak.is_none() && (by_operator || !record.disabled_by_operator) =>
            {
                record.disabled = false;
                record.disabled_by_operator = false;
            }
            Some(false) | None => {}
        }
        if let Some(limit_nanos) = self.limit_nanos {
            record.limit_nanos = limit_nanos;
        }
        if let Some(limit_reset) = self.limit_reset {
            record.limit_reset = limit_reset;
        }
        if let Some(include) = self.include_byok_in_limit {
            record.include_byok_in_limit = include;
        }
        // A rotated key's expiry is the end of its grace: never moved.
        if let Some(expires_at) = self.expires_at.filter(|_| record.rotated_to.is_none()) {
            record.expires_at = expires_at;
        }
        if let Some(allowed_models) = &self.allowed_models {
            record.allowed_models = allowed_models.clone();
        }
        if let Some(rate_limit) = self.rate_limit {
            record.rate_limit = rate_limit;
        }
        record.updated_at = Some(now);
    }
}

/// Disables `record`, remembering when the operator did (a disable by an
/// account's manager of a key the operator disabled leaves it the operator's).
pub(crate) fn disable(record: &mut KeyRecord, by_operator: bool) {
    record.disabled = true;
    record.disabled_by_operator |= by_operator;
}

/// Whether `id` can name an account: 1 to 64 characters of `A-Z a-z 0-9 . _ -`,
/// so it reads the same in a URL path, a Redis key and a log line.
pub fn is_valid_account_id(id: &str) -> bool {
    (1..=MAX_ACCOUNT_ID_CHARS).contains(&id.len())
        && id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn a_record() -> KeyRecord {
        KeyRecord {
            hash: KeyHash::from_hex(&"ab".repeat(32)).unwrap(),
            name: "n".into(),
            account: DEFAULT_ACCOUNT.into(),
            management: false,
            scoped_to_account: false,
            disabled: false,
            disabled_by_operator: false,
            limit_nanos: None,
            limit_reset: None,
            include_byok_in_limit: false,
            created_at: Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap(),
            updated_at: None,
            expires_at: None,
            last_used_at: None,
            leak: None,
            hint: None,
            rotated_to: None,
            allowed_models: None,
            rate_limit: None,
        }
    }

    #[test]
    fn debug_never_shows_the_hash() {
        let record = KeyRecord {
            rotated_to: Some(KeyHash::from_hex(&"cd".repeat(32)).unwrap()),
            hint: Some("mg-v1-Ab…xyz".into()),
            ..a_record()
        };
        let shown = format!(
            "{record:?} {:?}",
            crate::keys::KeyState::Active(record.clone().into())
        );
        assert!(
            !shown.contains("abab") && !shown.contains("cdcd"),
            "{shown}"
        );
        assert!(shown.contains("hash: KeyHash(…)"), "{shown}");
        // Derived: every field shows, a new one too.
        assert!(shown.contains("mg-v1-Ab…xyz"), "{shown}");
    }

    /// Stores hold these records: the hashes stay 64 hex digits, and a
    /// record written before this type held `KeyHash`es reads the same.
    #[test]
    fn the_stored_form_of_the_hashes_is_their_hex() {
        let record = KeyRecord {
            rotated_to: Some(KeyHash::from_hex(&"cd".repeat(32)).unwrap()),
            ..a_record()
        };
        let stored: serde_json::Value = serde_json::to_value(&record).unwrap();
        assert_eq!(stored["hash"], "ab".repeat(32));
        assert_eq!(stored["rotated_to"], "cd".repeat(32));
        assert_eq!(serde_json::from_value::<KeyRecord>(stored).unwrap(), record);
        let never_rotated = serde_json::to_value(a_record()).unwrap();
        assert_eq!(never_rotated["rotated_to"], serde_json::Value::Null);
        let mut older = never_rotated;
        older.as_object_mut().unwrap().remove("rotated_to");
        assert_eq!(
            serde_json::from_value::<KeyRecord>(older).unwrap(),
            a_record()
        );
        let mut upper = serde_json::to_value(a_record()).unwrap();
        upper["hash"] = "AB".repeat(32).into();
        assert!(serde_json::from_value::<KeyRecord>(upper).is_err());
    }

    #[test]
    fn account_ids_are_plain_words() {
        assert!(is_valid_account_id("default"));
        assert!(is_valid_account_id("team-a.prod_1"));
        assert!(!is_valid_account_id(""));
        assert!(!is_valid_account_id("a/b"));
        assert!(!is_valid_account_id("a b"));
        assert!(!is_valid_account_id("ümlaut"));
        assert!(!is_valid_account_id(&"a".repeat(65)));
        assert!(
            !is_valid_account_id(OPERATOR_ACCOUNT),
            "no account can take the operator's id"
        );
    }

    proptest! {
        #[test]
        fn a_valid_account_id_never_needs_escaping_in_a_path(id in "\\PC{0,80}") {
            if is_valid_account_id(&id) {
                let needs_escaping = id.contains(['/', '%', '?', '#', ' ', '{', '}']);
                prop_assert!(!needs_escaping);
            }
        }
    }
}
