//! The `mg-v1-` keys whose checksum this instance has already checked, so
//! that a key in use costs one SHA-256 a request (its hash), not two.

use std::sync::Mutex;

use crate::keys::KeyHash;

/// Hashes of `mg-v1-` keys that passed their checksum and then
/// authenticated. A checksum is a property of the key's text alone, and
/// the memo is keyed by the text's SHA-256, so a hit says the same text was
/// checked before: a key unknown here is still checked before any store
/// read, and no text can skip the check by sharing another's entry.
/// Holds no plaintext; lookups compare hashes in constant time
/// ([`KeyHash`]'s equality). Only keys found live are kept, so made-up
/// keys cannot fill it; past its bound it starts over.
#[derive(Debug)]
pub(crate) struct CheckedKeys {
    max_keys: usize,
    // A SHA-256 is no value a client picks the bits of: foldhash is enough.
    hashes: Mutex<foldhash::HashSet<KeyHash>>,
}

impl CheckedKeys {
    /// The default bound: as many keys as the directory caches.
    pub(crate) const DEFAULT_MAX_KEYS: usize = 100_000;

    pub(crate) fn new(max_keys: usize) -> Self {
        CheckedKeys {
            max_keys,
            hashes: Mutex::new(foldhash::HashSet::default()),
        }
    }

    fn hashes(&self) -> std::sync::MutexGuard<'_, foldhash::HashSet<KeyHash>> {
        // A set of plain values: a panic elsewhere leaves it whole.
        self.hashes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the key whose SHA-256 is `hash` passed its checksum here.
    pub(crate) fn holds(&self, hash: &KeyHash) -> bool {
        self.hashes().contains(hash)
    }

    /// Keeps `hash`, of a key whose checksum passed and which authenticated.
    pub(crate) fn remember(&self, hash: KeyHash) {
        let mut hashes = self.hashes();
        if hashes.len() >= self.max_keys && !hashes.contains(&hash) {
            hashes.clear();
        }
        hashes.insert(hash);
    }
}

impl Default for CheckedKeys {
    fn default() -> Self {
        CheckedKeys::new(Self::DEFAULT_MAX_KEYS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_what_it_remembers_within_its_bound() {
        let checked = CheckedKeys::new(2);
        let (a, b, c) = (KeyHash::of("a"), KeyHash::of("b"), KeyHash::of("c"));
        assert!(!checked.holds(&a));
        checked.remember(a);
        checked.remember(b);
        assert!(checked.holds(&a) && checked.holds(&b));
        checked.remember(b);
        assert!(checked.holds(&a), "a key kept again takes no room");
        checked.remember(c);
        assert!(checked.holds(&c));
        assert!(
            !checked.holds(&a) && !checked.holds(&b),
            "past the bound it starts over"
        );
    }
}
