//! Provisioning that survives restarts: see [`EnsuredKey`].

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::directory::{KeyDirectory, MAX_WRITE_ATTEMPTS, too_contended};
use super::key::{ApiKey, KeyHash};
use super::record::{
    AccountRecord, KeyRecord, NewAccount, NewKey, OPERATOR_ACCOUNT, is_valid_account_id,
};
use crate::store::{
    ACCOUNTS, AccountBalance, Expect, RecordStoreExt, StoreError, TopUpOutcome, WriteOutcome,
};

/// The collection of the keys [`KeyDirectory::ensure_key`] made for
/// `account`, by the service's id: each record names its key's hash.
pub fn provisioned_keys(account: &str) -> String {
    format!("provisioned_keys/{account}")
}

/// The collection of the grants [`KeyDirectory::grant_once`] gave
/// `account`, by grant id.
pub fn grants(account: &str) -> String {
    format!("grants/{account}")
}

/// What [`KeyDirectory::ensure_key`] found or made.
///
/// Provisioning that survives restarts: the keys, accounts and grants a
/// service makes when it starts, made once however often it starts on a
/// durable store, and by one of several instances starting at once.
///
/// - [`KeyDirectory::ensure_key`]: a key named by an id the service
///   chooses. The first call makes it and returns its plaintext
///   ([`EnsuredKey::Created`], shown once: keep it then); every later call
///   returns its record ([`EnsuredKey::Existing`]), or says it was deleted
///   ([`EnsuredKey::Deleted`]: a deleted key stays deleted).
/// - [`KeyDirectory::register_key`] is the same for a key the service keeps
///   in a secret: calling it at every start records the key once.
/// - [`KeyDirectory::ensure_named_account`]: an account with its name and
///   e-mail address.
/// - [`KeyDirectory::grant_once`]: credits given once for good (an initial
///   grant), where [`top_up_once`](KeyDirectory::top_up_once) remembers its
///   idempotency key only for
///   [`IDEMPOTENCY_KEY_TTL_HOURS`](crate::store::IDEMPOTENCY_KEY_TTL_HOURS).
///
/// Settings given to a second call are not applied: a key, account or
/// grant made before stands as it was made (change a key with
/// [`update`](KeyDirectory::update)).
///
/// ```
/// use std::sync::Arc;
/// use modelgate::keys::{EnsuredKey, KeyDirectory, NewKey, SharedStore};
/// use modelgate::store::{LedgerStore, MemoryStore, NANOS_PER_CREDIT};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), modelgate::store::StoreError> {
/// let store: SharedStore = Arc::new(MemoryStore::new());
/// // Each start of the service runs the same lines.
/// for start in 0..2 {
///     let directory = KeyDirectory::new(store.clone());
///     let new = NewKey { account: "acct".into(), ..NewKey::named("demo") };
///     match directory.ensure_key("demo-key", new).await? {
///         EnsuredKey::Created(key, _) => {
///             assert_eq!(start, 0);
///             println!("demo key (shown once): {}", key.expose());
///         }
///         EnsuredKey::Existing(record) => assert_eq!(record.name, "demo"),
///         EnsuredKey::Deleted(_) => unreachable!("nobody deleted it"),
///     }
///     directory.grant_once("acct", 10 * NANOS_PER_CREDIT, "initial-grant").await?;
/// }
/// let balance = store.account_balance("acct").await?;
/// assert_eq!(balance.balance_nanos, 10 * NANOS_PER_CREDIT);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub enum EnsuredKey {
    /// Made now: the plaintext, shown this once, and the record.
    Created(ApiKey, KeyRecord),
    /// Made before (its plaintext is not kept): its record as it is now,
    /// disabled or changed since as the case may be.
    Existing(KeyRecord),
    /// Made before and deleted since: it stays deleted, and no other key
    /// takes its id.
    Deleted(KeyHash),
}

/// Which key an id of [`provisioned_keys`] names.
#[derive(Serialize, Deserialize)]
struct Provisioned {
    hash: String,
    created_at: DateTime<Utc>,
}

/// A grant of [`grants`]: its amount, and once credited the balance right
/// after it.
#[derive(Serialize, Deserialize)]
struct Grant {
    amount_nanos: i64,
    credited: Option<GrantedBalance>,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
struct GrantedBalance {
    purchased_nanos: i64,
    balance_nanos: i64,
}

impl KeyDirectory {
    /// The key named `id` on `new`'s account: made with `new`'s settings
    /// the first time (its plaintext returned once), its record every time
    /// after, however many instances call this at once (exactly one makes
    /// the key). `id` is the service's stable name for the key, unique per
    /// account (an operator's key: among the operator's keys), 1 to 64
    /// characters of `A-Z a-z 0-9 . _ -`.
    ///
    /// A key deleted since is [`EnsuredKey::Deleted`], never made again;
    /// settings changed since (or different ones given now) are left as
    /// they are. The decision is one create-if-absent write naming the new
    /// key: a caller that loses it deletes the key it made and returns the
    /// winner's. A process stopped between making its key and that write
    /// leaves a key whose plaintext nobody holds (named as `new` says;
    /// delete it), and the next call makes another.
    pub async fn ensure_key(&self, id: &str, new: NewKey) -> Result<EnsuredKey, StoreError> {
        if !is_valid_account_id(id) {
            return Err(StoreError::invalid(
                "put_record",
                "a provisioned key's id is 1 to 64 characters of A-Z a-z 0-9 . _ -",
            ));
        }
        // Where create_key will put it: an operator's key on the operator's account.
        let account = if new.management && !new.scoped_to_account {
            OPERATOR_ACCOUNT
        } else {
            new.account.as_str()
        };
        let collection = provisioned_keys(account);
        for _ in 0..MAX_WRITE_ATTEMPTS {
            if let Some(found) = self
                .store()
                .get_json_at::<Provisioned>(&collection, id, self.now())
                .await?
            {
                return self.provisioned(&found.value).await;
            }
            let (key, record) = self.create_key(new.clone()).await?;
            let marker = Provisioned {
                hash: record.hash.to_hex(),
                created_at: record.created_at,
            };
            let outcome = self
                .write_json(&collection, id, &marker, Expect::Absent)
                .await?;
            if let WriteOutcome::Written { .. } = outcome {
                return Ok(EnsuredKey::Created(key, record));
            }
            // Another caller named its key first: this one goes, before
            // anyone could have been given it.
            self.delete(&record.hash).await?;
        }
        Err(too_contended("put_record"))
    }

    /// The key a marker names, as it is now.
    async fn provisioned(&self, marker: &Provisioned) -> Result<EnsuredKey, StoreError> {
        let hash = KeyHash::from_hex(&marker.hash).ok_or_else(|| {
            StoreError::corrupt("get_record", "a provisioned key names no key hash")
        })?;
        Ok(match self.get(&hash).await? {
            Some(found) => EnsuredKey::Existing(found.value),
            // Deleted: the tombstone may have expired, the key is gone anyway.
            None => EnsuredKey::Deleted(hash),
        })
    }

    /// The account `new.id`, made with `new`'s name and e-mail address if
    /// it does not exist; its record as stored. An account made before
    /// without a name (by its first key or top-up, or
    /// [`ensure_account`](Self::ensure_account)) takes `new`'s name and
    /// address; one with a name or an address stands as it is.
    pub async fn ensure_named_account(&self, new: NewAccount) -> Result<AccountRecord, StoreError> {
        if let Some(created) = self.create_account(new.clone()).await? {
            return Ok(created);
        }
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let Some(found) = self
                .store()
                .get_json_at::<AccountRecord>(ACCOUNTS, &new.id, self.now())
                .await?
            else {
                return Err(too_contended("put_record"));
            };
            let stored = found.value;
            if !stored.name.is_empty() || stored.email.is_some() {
                return Ok(stored);
            }
            let named = AccountRecord {
                name: new.name.clone(),
                email: new.email.clone(),
                ..stored
            };
            let outcome = self
                .write_json(ACCOUNTS, &new.id, &named, Expect::Revision(found.revision))
                .await?;
            if let WriteOutcome::Written { .. } = outcome {
                return Ok(named);
            }
        }
        Err(too_contended("put_record"))
    }

    /// Credits `amount_nanos` to the account `id` (created if new) once for
    /// good per `grant` (1 to 64 characters of `A-Z a-z 0-9 . _ -`): what a
    /// service gives at its first start (`"initial-grant"`) and must not
    /// give again at the next, however much later. Answers as
    /// [`top_up_once`](Self::top_up_once): [`TopUpOutcome::Credited`] the
    /// first time, [`TopUpOutcome::Repeated`] with the balance right after
    /// that first credit, [`TopUpOutcome::KeyReused`] when the grant was
    /// given for another amount.
    ///
    /// The grant is recorded for good, then credited through
    /// [`top_up_once`](Self::top_up_once), then marked credited: callers at
    /// once credit it once. Known limit: a process stopped between the
    /// credit and its mark, with no call for
    /// [`IDEMPOTENCY_KEY_TTL_HOURS`](crate::store::IDEMPOTENCY_KEY_TTL_HOURS)
    /// after, can credit it twice.
    pub async fn grant_once(
        &self,
        id: &str,
        amount_nanos: i64,
        grant: &str,
    ) -> Result<TopUpOutcome, StoreError> {
        if !is_valid_account_id(grant) {
            return Err(StoreError::invalid(
                "top_up",
                "a grant's id is 1 to 64 characters of A-Z a-z 0-9 . _ -",
            ));
        }
        self.ensure_account(id).await?;
        let collection = grants(id);
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let found = self
                .store()
                .get_json_at::<Grant>(&collection, grant, self.now())
                .await?;
            match found {
                Some(found) if found.value.amount_nanos != amount_nanos => {
                    return Ok(TopUpOutcome::KeyReused {
                        first_amount_nanos: found.value.amount_nanos,
                    });
                }
                Some(found) => {
                    if let Some(credited) = found.value.credited {
                        return Ok(TopUpOutcome::Repeated(AccountBalance {
                            purchased_nanos: credited.purchased_nanos,
                            balance_nanos: credited.balance_nanos,
                        }));
                    }
                }
                None => {
                    // Recorded before it is credited: a caller that finds
                    // it uncredited credits it through the same
                    // idempotency key, once.
                    let pending = Grant {
                        amount_nanos,
                        credited: None,
                    };
                    let outcome = self
                        .write_json(&collection, grant, &pending, Expect::Absent)
                        .await?;
                    if let WriteOutcome::Conflict { .. } = outcome {
                        continue;
                    }
                }
            }
            let outcome = self
                .top_up_once(
                    id,
                    amount_nanos,
                    &format!("{}grant:{grant}", super::input::RESERVED_IDEMPOTENCY_PREFIX),
                )
                .await?;
            if let Some(balance) = outcome.balance() {
                let done = Grant {
                    amount_nanos,
                    credited: Some(GrantedBalance {
                        purchased_nanos: balance.purchased_nanos,
                        balance_nanos: balance.balance_nanos,
                    }),
                };
                self.write_json(&collection, grant, &done, Expect::Any)
                    .await?;
            }
            return Ok(outcome);
        }
        Err(too_contended("put_record"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::keys::SharedStore;
    use crate::store::{MemoryStore, NANOS_PER_CREDIT};
    use chrono::TimeZone;
    use std::sync::Arc;
    use std::time::Duration;

    fn directory() -> (KeyDirectory, ManualClock) {
        let clock = ManualClock::new(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap());
        let store: SharedStore = Arc::new(MemoryStore::new());
        let directory = KeyDirectory::builder(store)
            .clock(Arc::new(clock.clone()))
            .build();
        (directory, clock)
    }

    fn on(account: &str) -> NewKey {
        NewKey {
            account: account.to_owned(),
            ..NewKey::named("svc")
        }
    }

    #[tokio::test]
    async fn a_key_is_made_once_and_found_after() {
        let (directory, _) = directory();
        let EnsuredKey::Created(key, made) = directory.ensure_key("svc", on("a")).await.unwrap()
        else {
            panic!("the first call makes the key");
        };
        assert_eq!(key.hash(), made.hash);
        let again = directory.ensure_key("svc", on("a")).await.unwrap();
        assert!(matches!(again, EnsuredKey::Existing(found) if found == made));
        // Other settings now are not applied.
        let changed = NewKey {
            limit_nanos: Some(5),
            ..on("a")
        };
        let changed = directory.ensure_key("svc", changed).await.unwrap();
        assert!(matches!(changed, EnsuredKey::Existing(found) if found == made));
        let listed = directory.list(0, true, Some("a"), 10).await.unwrap();
        assert_eq!(listed.len(), 1);
    }

    #[tokio::test]
    async fn ids_are_per_account() {
        let (directory, _) = directory();
        let first = directory.ensure_key("svc", on("a")).await.unwrap();
        let second = directory.ensure_key("svc", on("b")).await.unwrap();
        assert!(matches!(first, EnsuredKey::Created(..)));
        assert!(matches!(second, EnsuredKey::Created(..)));
    }

    #[tokio::test]
    async fn a_deleted_key_stays_deleted() {
        let (directory, _) = directory();
        let EnsuredKey::Created(_, made) = directory.ensure_key("svc", on("a")).await.unwrap()
        else {
            panic!("made");
        };
        assert!(directory.delete(&made.hash).await.unwrap());
        let again = directory.ensure_key("svc", on("a")).await.unwrap();
        assert!(matches!(again, EnsuredKey::Deleted(hash) if hash == made.hash));
    }

    #[tokio::test]
    async fn a_bad_id_is_refused() {
        let (directory, _) = directory();
        for id in ["", "a b", "x/y", &"a".repeat(65)] {
            let error = directory.ensure_key(id, on("a")).await.unwrap_err();
            assert!(error.to_string().contains("provisioned key's id"), "{id:?}");
        }
        let error = directory.grant_once("a", 1, "a b").await.unwrap_err();
        assert!(error.to_string().contains("grant's id"));
    }

    #[tokio::test]
    async fn callers_at_once_make_one_key() {
        let (directory, _) = directory();
        let calls = (0..8).map(|_| {
            let directory = directory.clone();
            tokio::spawn(async move { directory.ensure_key("svc", on("a")).await.unwrap() })
        });
        let mut created = 0;
        let mut hashes = std::collections::HashSet::new();
        for call in calls {
            match call.await.unwrap() {
                EnsuredKey::Created(_, record) => {
                    created += 1;
                    hashes.insert(record.hash);
                }
                EnsuredKey::Existing(record) => {
                    hashes.insert(record.hash);
                }
                EnsuredKey::Deleted(_) => panic!("nothing was deleted"),
            }
        }
        assert_eq!(created, 1);
        assert_eq!(hashes.len(), 1);
        let listed = directory.list(0, true, Some("a"), 100).await.unwrap();
        assert_eq!(listed.len(), 1, "the losers' keys are gone");
    }

    #[tokio::test]
    async fn a_grant_is_credited_once_for_good() {
        let (directory, clock) = directory();
        let ten = 10 * NANOS_PER_CREDIT;
        let first = directory.grant_once("a", ten, "initial").await.unwrap();
        assert!(matches!(first, TopUpOutcome::Credited(_)));
        // Well past the ledger's memory of the idempotency key.
        clock.advance(Duration::from_secs(30 * 24 * 3600));
        let again = directory.grant_once("a", ten, "initial").await.unwrap();
        assert_eq!(again, TopUpOutcome::Repeated(first.balance().unwrap()));
        assert_eq!(
            directory.grant_once("a", 5, "initial").await.unwrap(),
            TopUpOutcome::KeyReused {
                first_amount_nanos: ten
            }
        );
        let balance = directory.store().account_balance("a").await.unwrap();
        assert_eq!(balance.balance_nanos, ten);
    }

    #[tokio::test]
    async fn a_grant_recorded_but_not_credited_is_credited_by_the_next_call() {
        let (directory, _) = directory();
        let pending = Grant {
            amount_nanos: 7,
            credited: None,
        };
        directory
            .write_json(&grants("a"), "g", &pending, Expect::Absent)
            .await
            .unwrap();
        let outcome = directory.grant_once("a", 7, "g").await.unwrap();
        assert!(matches!(outcome, TopUpOutcome::Credited(_)));
        assert_eq!(
            directory
                .store()
                .account_balance("a")
                .await
                .unwrap()
                .balance_nanos,
            7
        );
    }

    #[tokio::test]
    async fn an_unnamed_account_takes_the_name_and_a_named_one_stands() {
        let (directory, _) = directory();
        directory.ensure_account("a").await.unwrap();
        let new = NewAccount {
            id: "a".into(),
            name: "Acme".into(),
            email: Some("ops@acme.example".into()),
        };
        let named = directory.ensure_named_account(new.clone()).await.unwrap();
        assert_eq!(named.name, "Acme");
        let other = NewAccount {
            name: "Other".into(),
            ..new
        };
        let stood = directory.ensure_named_account(other).await.unwrap();
        assert_eq!(stood, named);
        assert_eq!(directory.account("a").await.unwrap(), Some(named));
    }
}
