//! `sqlite`: how a SQLite store commits.

use serde::Deserialize;

/// `sqlite` in [`GatewayConfig`](super::GatewayConfig).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SqliteSection {
    /// `"normal"` (absent): a commit survives the process being killed; a
    /// power loss may lose the last ones. `"full"`: every commit is on disk
    /// before its request goes on, at a sync per transaction.
    pub synchronous: SqliteSynchronous,
}

/// [`SqliteSection::synchronous`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSynchronous {
    /// `synchronous=NORMAL`.
    #[default]
    Normal,
    /// `synchronous=FULL`.
    Full,
}
