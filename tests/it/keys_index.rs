//! Each account's index of keys, on memory, SQLite and Redis: an account's
//! list is exact among many keys of other accounts through every change,
//! across two instances sharing one Redis, through a crash between the
//! index's write and the record's, and on a store made before the index.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use common::backends::{every_backend, redis_store};
use common::redis_server::RedisServer;
use modelgate::auth::{ApiKey, KeyHash};
use modelgate::clock::{Clock, ManualClock};
use modelgate::keys::{
    KeyDirectory, KeyRecord, KeyUpdate, NewKey, RotateOutcome, SharedStore, account_keys,
};
use modelgate::store::{Expect, KEYS, MemoryStore, PutOptions, RecordStoreExt};

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 18, 12, 0, 0).unwrap()
}

fn directory(store: SharedStore, clock: &ManualClock) -> KeyDirectory {
    KeyDirectory::builder(store)
        .clock(Arc::new(clock.clone()))
        .cache_ttl(Duration::ZERO)
        .build()
}

fn on(account: &str, name: &str) -> NewKey {
    NewKey {
        account: account.to_owned(),
        ..NewKey::named(name)
    }
}

fn hashes(records: &[KeyRecord]) -> Vec<KeyHash> {
    records.iter().map(|record| record.hash).collect()
}

/// Every key of `account` the directory lists, read `page_size` at a time
/// by offset, as a client pages.
async fn paged(
    directory: &KeyDirectory,
    account: &str,
    include_disabled: bool,
    page_size: usize,
) -> Vec<KeyHash> {
    let mut all = Vec::new();
    loop {
        let page = directory
            .list(all.len(), include_disabled, Some(account), page_size)
            .await
            .unwrap();
        all.extend(hashes(&page));
        if page.len() < page_size {
            return all;
        }
    }
}

/// Makes `per_round` keys spread over three other accounts, then one of
/// `account`, `rounds` times; the hashes of `account`'s, newest first.
async fn interleaved(
    directory: &KeyDirectory,
    account: &str,
    rounds: usize,
    per_round: usize,
) -> Vec<KeyHash> {
    let mut mine = Vec::new();
    for round in 0..rounds {
        for index in 0..per_round {
            let other = format!("other{}", index % 3);
            directory
                .create_key(on(&other, &format!("o{round}-{index}")))
                .await
                .unwrap();
        }
        let (key, _) = directory
            .create_key(on(account, &format!("k{round}")))
            .await
            .unwrap();
        mine.push(key.hash());
    }
    mine.reverse();
    mine
}

#[tokio::test]
async fn an_account_lists_exactly_its_keys_among_many_of_other_accounts() {
    for backend in every_backend().await {
        let name = backend.name;
        let clock = ManualClock::new(t0());
        let directory = directory(backend.store.clone(), &clock);
        let mut mine = interleaved(&directory, "acme", 8, 40).await;
        let listed = directory.list(0, false, Some("acme"), 100).await.unwrap();
        assert_eq!(hashes(&listed), mine, "{name}: newest first");
        assert!(listed.iter().all(|record| record.account == "acme"));
        for (number, other) in ["other0", "other1", "other2"].iter().enumerate() {
            let per_round = (0..40).filter(|index| index % 3 == number).count();
            let theirs = paged(&directory, other, true, 100).await;
            assert_eq!(theirs.len(), 8 * per_round, "{name}: {other}");
        }

        // A rotation's successor is the newest; its predecessor stays, in
        // its grace.
        let rotated = mine[2];
        let successor = match directory
            .rotate_key(&rotated, Duration::from_secs(3600))
            .await
            .unwrap()
        {
            RotateOutcome::Rotated { record, .. } => record.hash,
            other => panic!("{name}: {other:?}"),
        };
        mine.insert(0, successor);
        // A deleted key goes; a disabled one is shown only when asked.
        let deleted = mine.remove(5);
        assert!(directory.delete(&deleted).await.unwrap());
        // (Not the rotated key: its disable would reach its successor.)
        let disabled = mine[4];
        let disable = KeyUpdate {
            disabled: Some(true),
            ..KeyUpdate::default()
        };
        directory
            .update(&disabled, &disable)
            .await
            .unwrap()
            .unwrap();
        let enabled: Vec<KeyHash> = mine.iter().copied().filter(|h| *h != disabled).collect();

        assert_eq!(paged(&directory, "acme", true, 100).await, mine, "{name}");
        assert_eq!(
            paged(&directory, "acme", false, 100).await,
            enabled,
            "{name}"
        );
        for page_size in [1, 2, 3] {
            assert_eq!(
                paged(&directory, "acme", true, page_size).await,
                mine,
                "{name}: pages of {page_size}"
            );
            assert_eq!(
                paged(&directory, "acme", false, page_size).await,
                enabled,
                "{name}: pages of {page_size}"
            );
        }
        let past_the_end = directory
            .list(mine.len(), true, Some("acme"), 100)
            .await
            .unwrap();
        assert!(past_the_end.is_empty(), "{name}");
        // An operator's key is no account's, even one made for `acme`.
        directory
            .create_key(NewKey {
                management: true,
                ..on("acme", "operator")
            })
            .await
            .unwrap();
        assert_eq!(paged(&directory, "acme", true, 100).await, mine, "{name}");
        assert!(paged(&directory, "nobody", true, 100).await.is_empty());
        // The index holds no entry of a deleted key nor of the operator's.
        let mut indexed: Vec<String> = backend
            .store
            .list_records_at(&account_keys("acme"), 0, 100, clock.now())
            .await
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        indexed.sort();
        let mut kept: Vec<String> = mine.iter().map(KeyHash::to_hex).collect();
        kept.sort();
        assert_eq!(indexed, kept, "{name}");
    }
}

#[tokio::test]
async fn two_instances_on_one_redis_list_each_other_s_changes() {
    let server = RedisServer::start();
    let clock = ManualClock::new(t0());
    let a = directory(redis_store(&server).await, &clock);
    let b = directory(redis_store(&server).await, &clock);
    let mut mine = interleaved(&a, "acme", 4, 10).await;
    assert_eq!(paged(&b, "acme", true, 2).await, mine);
    let (made_on_b, _) = b.create_key(on("acme", "from b")).await.unwrap();
    mine.insert(0, made_on_b.hash());
    assert_eq!(paged(&a, "acme", true, 2).await, mine);
    let deleted = mine.remove(2);
    assert!(b.delete(&deleted).await.unwrap());
    assert_eq!(paged(&a, "acme", true, 3).await, mine);
    assert_eq!(paged(&b, "acme", true, 100).await, mine);
}

#[tokio::test]
async fn a_crash_between_an_index_entry_and_its_record_is_invisible() {
    for backend in every_backend().await {
        let name = backend.name;
        let store = backend.store.clone();
        let clock = ManualClock::new(t0());
        let directory = directory(store.clone(), &clock);
        let mine = interleaved(&directory, "acme", 3, 5).await;
        let index = account_keys("acme");
        let now = clock.now();
        // A creation that stopped after its entry: a key never recorded.
        let never_made = ApiKey::generate().hash();
        // A deletion that stopped before removing its entry.
        let (half_deleted, _) = directory.create_key(on("acme", "gone")).await.unwrap();
        store
            .delete_record_at(KEYS, &half_deleted.hash().to_hex(), Expect::Any, now)
            .await
            .unwrap();
        // An entry naming another account's key.
        let (theirs, _) = directory.create_key(on("other0", "theirs")).await.unwrap();
        for stray in [never_made, theirs.hash()] {
            store
                .put_record_at(
                    &index,
                    &stray.to_hex(),
                    b"{}",
                    Expect::Absent,
                    PutOptions::default(),
                    now,
                )
                .await
                .unwrap();
        }
        for page_size in [1, 2, 100] {
            assert_eq!(
                paged(&directory, "acme", true, page_size).await,
                mine,
                "{name}: pages of {page_size}"
            );
        }
        // A key made after them is listed first, and they still are not.
        let (late, _) = directory.create_key(on("acme", "late")).await.unwrap();
        let listed = paged(&directory, "acme", true, 100).await;
        assert_eq!(listed[0], late.hash(), "{name}");
        assert_eq!(listed[1..], mine[..], "{name}");
    }
}

/// The records a store of an older version held: keys of two accounts
/// written to `KEYS` alone, oldest first, as that version wrote them.
async fn old_store_records() -> Vec<KeyRecord> {
    let clock = ManualClock::new(t0());
    let elsewhere = directory(Arc::new(MemoryStore::new()), &clock);
    let mut records = Vec::new();
    for index in 0..30 {
        let account = if index % 3 == 0 { "acme" } else { "other0" };
        let (_, record) = elsewhere
            .create_key(on(account, &format!("k{index}")))
            .await
            .unwrap();
        records.push(record);
    }
    records
}

#[tokio::test]
async fn a_store_made_before_the_index_is_indexed_once_and_lists_every_key() {
    let records = old_store_records().await;
    let expected = |account: &str| -> Vec<KeyHash> {
        records
            .iter()
            .rev()
            .filter(|record| record.account == account)
            .map(|record| record.hash)
            .collect()
    };
    for backend in every_backend().await {
        let name = backend.name;
        let clock = ManualClock::new(t0());
        for record in &records {
            backend
                .store
                .put_json_at(
                    KEYS,
                    &record.hash.to_hex(),
                    record,
                    Expect::Absent,
                    PutOptions::default(),
                    clock.now(),
                )
                .await
                .unwrap();
        }
        // Two instances build it at once: each walks, neither harms the other.
        let first = directory(backend.store.clone(), &clock);
        let second = directory(backend.store.clone(), &clock);
        let (one, two) = tokio::join!(first.build_key_index(), second.build_key_index());
        let (one, two) = (one.unwrap(), two.unwrap());
        assert!(one == records.len() || two == records.len(), "{name}");
        assert_eq!(first.build_key_index().await.unwrap(), 0, "{name}: once");
        for directory in [&first, &second] {
            assert_eq!(
                paged(directory, "acme", true, 3).await,
                expected("acme"),
                "{name}"
            );
            assert_eq!(
                paged(directory, "other0", true, 7).await,
                expected("other0"),
                "{name}"
            );
        }
    }
}

#[tokio::test]
async fn an_account_s_first_listing_indexes_a_store_made_before_the_index() {
    let records = old_store_records().await;
    for backend in every_backend().await {
        let name = backend.name;
        let clock = ManualClock::new(t0());
        for record in &records {
            backend
                .store
                .put_json_at(
                    KEYS,
                    &record.hash.to_hex(),
                    record,
                    Expect::Absent,
                    PutOptions::default(),
                    clock.now(),
                )
                .await
                .unwrap();
        }
        let directory = directory(backend.store.clone(), &clock);
        let listed = paged(&directory, "acme", true, 4).await;
        let expected: Vec<KeyHash> = records
            .iter()
            .rev()
            .filter(|record| record.account == "acme")
            .map(|record| record.hash)
            .collect();
        assert_eq!(listed, expected, "{name}");
        assert_eq!(directory.build_key_index().await.unwrap(), 0, "{name}");
    }
}
