//! Waiting for settlements: the end of a response no longer waits for its
//! cost to be recorded, so a test that reads usage right after a response
//! waits for the request's hold to be released (which its settlement does,
//! in the same step as it records the cost).

#![allow(dead_code)]

use modelgate::store::{KeyUsage, LedgerStore};

use super::wait::{PATIENCE, wait_for};

/// The key's usage once none of its requests holds anything: every
/// settlement of its requests so far has landed. `now` is the gateway's
/// time (a manual clock's, in tests that set one).
pub async fn settled<S: LedgerStore + ?Sized>(
    store: &S,
    account: &str,
    key_hash: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> KeyUsage {
    wait_for(PATIENCE, || async {
        let usage = store.key_usage(account, key_hash, now).await.unwrap();
        if usage.reserved_nanos == 0 {
            Ok(usage)
        } else {
            Err(format!(
                "the key {key_hash} of {account} still holds credits: {usage:?}"
            ))
        }
    })
    .await
}

/// [`settled`] for the plaintext `key`, its account looked up.
pub async fn key_settled(
    store: &modelgate::keys::SharedStore,
    key: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> KeyUsage {
    let hash = modelgate::auth::KeyHash::of(key);
    let record = modelgate::keys::KeyDirectory::new(store.clone())
        .get(&hash)
        .await
        .unwrap()
        .expect("a key of this store");
    settled(store.as_ref(), &record.value.account, &hash.to_hex(), now).await
}
