//! WAL checkpoints off the store's thread. SQLite otherwise copies the WAL
//! into the database file (and syncs it) inside whichever commit crosses
//! its threshold, so one call in a few hundred waited for that copy: a
//! checkpoint on a connection of its own runs beside the store's commits
//! (WAL lets a checkpoint and a writer go on together), and the store's
//! own automatic checkpoint stays only as a bound on the WAL's size. The
//! checkpointer also rewinds the WAL when it has grown (see
//! [`checkpoint_once`]).

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

/// WAL frames (4 KiB pages) past which the checkpointer rewinds the WAL:
/// a third of a second to a second of commits at one connection (a chat
/// request wrote about 16 frames in the runs measured).
const WAL_RESTART_FRAMES: i64 = 4 * 1024;

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
        match checkpoint_once(connection) {
            Ok(()) => failing = false,
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(error = %error, "a SQLite WAL checkpoint failed; retrying");
            }
            Err(_) => {}
        }
    }
}

/// One checkpoint: a PASSIVE one beside the store's commits, and when the
/// WAL has grown past [`WAL_RESTART_FRAMES`], a RESTART that sets it back
/// to its start.
///
/// Why the RESTART: SQLite rewinds the WAL only when a transaction begins
/// with every frame already copied, and a PASSIVE checkpoint never gets
/// there while the store commits every millisecond (the frames written
/// during its copy are left). The WAL then grew to [`WAL_BOUND_PAGES`] and
/// the commit that crossed it checkpointed 16,000 frames itself, a 40 to
/// 60 ms stall every few seconds, and each PASSIVE checkpoint synced
/// megabytes. The RESTART holds off the store's writes only while it
/// copies what came since the PASSIVE ones just before it (a few
/// milliseconds of commits) and syncs.
fn checkpoint_once(connection: &Connection) -> rusqlite::Result<()> {
    // Answers the frames in the WAL (its row: busy, frames, frames copied).
    let passive = || {
        connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            row.get::<_, i64>(1)
        })
    };
    let frames = passive()?;
    if frames < WAL_RESTART_FRAMES {
        return Ok(());
    }
    // Again, beside the commits: what the first one left is small, so
    // that the RESTART's own copy, which holds writes off, is smaller.
    passive()?;
    connection.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{LedgerStore, SqliteStore};

    /// The frames in the WAL now: `mxFrame` of the wal-index header, the
    /// first bytes of the `-shm` file, read without a connection so that
    /// the reading takes no lock and copies nothing.
    fn wal_frames(database: &Path) -> u32 {
        let mut shm = database.as_os_str().to_owned();
        shm.push("-shm");
        let header = std::fs::read(std::path::PathBuf::from(shm)).unwrap();
        u32::from_ne_bytes(header[16..20].try_into().unwrap())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wal_is_rewound_while_the_store_commits_without_pause() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("m.db");
        let store = SqliteStore::open(&path, SqliteStoreConfig::default()).unwrap();
        // One commit after the other, never a pause for a PASSIVE
        // checkpoint to catch up in, until the WAL starts again from its
        // beginning; before, that took the commit crossing
        // WAL_BOUND_PAGES, which checkpointed them all itself.
        let mut frames_before = 0;
        let mut calls = 0u64;
        loop {
            store.top_up("acct", 1).await.unwrap();
            calls += 1;
            let frames = wal_frames(&path);
            if frames < frames_before && i64::from(frames_before) >= WAL_RESTART_FRAMES {
                break;
            }
            assert!(
                i64::from(frames) < WAL_BOUND_PAGES,
                "the WAL reached {frames} frames after {calls} commits without being rewound"
            );
            frames_before = frames;
        }
    }
}
