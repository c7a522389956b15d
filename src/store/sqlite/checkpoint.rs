//! WAL checkpoints off the store's thread. SQLite otherwise copies the WAL
//! into the database file (and syncs it) inside whichever commit crosses
//! its threshold, so one call in a few hundred waited for that copy: a
//! checkpoint on a connection of its own runs beside the store's commits
//! (WAL lets a checkpoint and a writer go on together), and the store's
//! own automatic checkpoint stays only as a bound on the WAL's size.

use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use rusqlite::Connection;

use super::store::{SqliteStoreConfig, backend, sql};
use crate::store::StoreError;

/// How often the committed pages are copied into the database file.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

/// The store's own automatic checkpoint, in pages of the WAL (4 KiB each):
/// reached only if the checkpointer falls far behind.
pub(super) const WAL_BOUND_PAGES: i64 = 16 * 1024;

/// Keeps the checkpointer's thread running; dropped with the store, it ends
/// the thread.
pub(super) struct Checkpointer {
    _running: mpsc::Sender<()>,
}

/// Starts the thread that checkpoints the WAL of the file at `path` every
/// [`CHECKPOINT_INTERVAL`] until the returned [`Checkpointer`] is dropped.
pub(super) fn start(path: &Path, config: &SqliteStoreConfig) -> Result<Checkpointer, StoreError> {
    let connection = Connection::open(path).map_err(sql("open"))?;
    connection
        .busy_timeout(config.busy_timeout)
        .map_err(sql("open"))?;
    let (running, stopped) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("modelgate-sqlite-checkpoint".into())
        .spawn(move || checkpoint_until_stopped(&connection, &stopped))
        .map_err(|error| backend("open", error))?;
    Ok(Checkpointer { _running: running })
}

fn checkpoint_until_stopped(connection: &Connection, stopped: &mpsc::Receiver<()>) {
    // Told once, not every interval, while checkpoints keep failing.
    let mut failing = false;
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(CHECKPOINT_INTERVAL) {
        // PASSIVE: copies what no reader still needs, never waits on them.
        match connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            Ok(()) => failing = false,
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(error = %error, "a SQLite WAL checkpoint failed; retrying");
            }
            Err(_) => {}
        }
    }
}
