//! The in-process cache in front of the store lookups KeyDirectory and
//! ByokDirectory make on every request.

use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// Lookups trusted for a while. What was found is kept apart from answers
/// that there is nothing: callers choose what they look up (a made-up key,
/// a provider named in a model id), and a flood of misses must never push
/// real entries out. Misses get a quarter of the room.
pub(crate) struct LookupCache<K, V> {
    ttl: Duration,
    max_found: usize,
    sides: Mutex<Sides<K, V>>,
    // Bumped by every local change, so a lookup that started before the
    // change never puts the old answer back.
    generation: AtomicU64,
}

struct Sides<K, V> {
    // Read once per request, by key hash (a SHA-256: no client picks its
    // bits): foldhash, at a fraction of SipHash's cost.
    found: foldhash::HashMap<K, Entry<V>>,
    missing: foldhash::HashMap<K, Entry<V>>,
}

struct Entry<V> {
    fetched_at: DateTime<Utc>,
    value: V,
}

impl<K: Hash + Eq, V: Clone> LookupCache<K, V> {
    /// Trusts a lookup for `ttl` (zero: never), holding at most `max_found`
    /// entries found.
    pub(crate) fn new(ttl: Duration, max_found: usize) -> Self {
        LookupCache {
            ttl,
            max_found,
            sides: Mutex::new(Sides {
                found: foldhash::HashMap::default(),
                missing: foldhash::HashMap::default(),
            }),
            generation: AtomicU64::new(0),
        }
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    fn sides(&self) -> MutexGuard<'_, Sides<K, V>> {
        // Entries are written whole; a panic elsewhere cannot leave one half-made.
        self.sides
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The answer for `key` when still fresh at `now`.
    pub(crate) fn get(&self, key: &K, now: DateTime<Utc>) -> Option<V> {
        if self.ttl.is_zero() {
            return None;
        }
        let sides = self.sides();
        let entry = sides.found.get(key).or_else(|| sides.missing.get(key))?;
        is_fresh(entry, now, self.ttl).then(|| entry.value.clone())
    }

    /// Whether `key` is among the entries found, fresh or not: a lookup
    /// that found it was made, and nothing since dropped it.
    pub(crate) fn holds_found(&self, key: &K) -> bool {
        self.sides().found.contains_key(key)
    }

    /// Taken before a lookup and given to [`remember`](Self::remember).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Keeps what a lookup started at `generation` found (`found`: whether
    /// there was something), unless a change came in between.
    pub(crate) fn remember(
        &self,
        key: K,
        value: &V,
        found: bool,
        now: DateTime<Utc>,
        generation: u64,
    ) {
        if self.ttl.is_zero() {
            return;
        }
        let mut sides = self.sides();
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if !found {
            // Found no more: no stale entry may still say it was.
            sides.found.remove(&key);
        }
        let (map, bound) = if found {
            (&mut sides.found, self.max_found)
        } else {
            (&mut sides.missing, self.max_found / 4)
        };
        if bound == 0 {
            return;
        }
        if map.len() >= bound {
            let ttl = self.ttl;
            map.retain(|_, entry| is_fresh(entry, now, ttl));
            if map.len() >= bound {
                map.clear();
            }
        }
        map.insert(
            key,
            Entry {
                fetched_at: now,
                value: value.clone(),
            },
        );
    }

    /// Drops `key`, so its next lookup reads the store.
    pub(crate) fn forget(&self, key: &K) {
        let mut sides = self.sides();
        self.generation.fetch_add(1, Ordering::AcqRel);
        sides.found.remove(key);
        sides.missing.remove(key);
    }

    /// How many entries found and missing it holds.
    #[cfg(test)]
    pub(crate) fn sizes(&self) -> (usize, usize) {
        let sides = self.sides();
        (sides.found.len(), sides.missing.len())
    }
}

fn is_fresh<V>(entry: &Entry<V>, now: DateTime<Utc>, ttl: Duration) -> bool {
    // A clock that went backwards makes an entry stale, not eternal.
    (now - entry.fetched_at).to_std().is_ok_and(|age| age < ttl)
}
