//! [`Store`], everything a gateway keeps, and the map the in-process
//! backends key their state with.

use std::sync::Arc;

use super::{AppUsageStore, CounterStore, LedgerStore, RecordStore};

/// The maps every request reads and writes a few times, by scope, key hash,
/// reservation or holder id: ids the gateway made or checked, hashed with
/// foldhash at a fraction of SipHash's cost. Maps whose keys a client names
/// (app usage rows, webhook records) keep SipHash: foldhash's random seeds
/// are no defence against someone who can time lookups.
pub(crate) type FastMap<K, V> = foldhash::HashMap<K, V>;

/// A store shared by every layer of one gateway.
pub type SharedStore = Arc<dyn Store>;

/// Everything a gateway keeps in its store.
pub trait Store: CounterStore + LedgerStore + RecordStore + AppUsageStore {}

impl<T: CounterStore + LedgerStore + RecordStore + AppUsageStore> Store for T {}
