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

use super::busy;
use super::store::{SqliteStoreConfig, backend, sql};
use crate::store::StoreError;

/// How often the committed pages are copied into the database file while
/// the store writes: small copies, each synced, disturb its commits less
/// than large ones (at one connection, p99 about 5 ms against 7 to 14 ms
/// every 200 ms).
const BUSY_CHECKPOINT_INTERVAL: Duration = Duration::from_millis(20);

/// How often while nothing was written since the last checkpoint.
const IDLE_CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

/// The WAL's size past which the store's own automatic checkpoint copies
/// it inside a commit: reached only if the checkpointer falls far behind.
const WAL_BOUND_BYTES: i64 = 64 << 20;

/// The WAL's size past which the checkpointer rewinds it: a few seconds
/// of commits at one connection (a chat request writes about 15 pages).
const WAL_RESTART_BYTES: i64 = 16 << 20;

/// [`WAL_BOUND_BYTES`] in pages of the file behind `connection`, for
/// `wal_autocheckpoint`.
pub(super) fn wal_bound_pages(connection: &Connection) -> rusqlite::Result<i64> {
    Ok(WAL_BOUND_BYTES / page_bytes(connection)?)
}

fn page_bytes(connection: &Connection) -> rusqlite::Result<i64> {
    connection.query_row("PRAGMA page_size", [], |row| row.get::<_, i64>(0))
}

/// Keeps the checkpointer's thread running; dropped with the store, it ends
/// the thread.
pub(super) struct Checkpointer {
    _running: mpsc::Sender<()>,
}

/// Starts the thread that checkpoints the WAL of the file at `path` every
/// [`CHECKPOINT_INTERVAL`] until the returned [`Checkpointer`] is dropped.
pub(super) fn start(path: &Path, config: &SqliteStoreConfig) -> Result<Checkpointer, StoreError> {
    let connection = Connection::open(path).map_err(sql("open"))?;
    busy::wait_in_small_steps(&connection).map_err(sql("open"))?;
    let wait_limit = config.busy_timeout;
    let (running, stopped) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("modelgate-sqlite-checkpoint".into())
        .spawn(move || {
            busy::limit_waits_on_this_thread(wait_limit);
            checkpoint_until_stopped(&connection, &stopped)
        })
        .map_err(|error| backend("open", error))?;
    Ok(Checkpointer { _running: running })
}

fn checkpoint_until_stopped(connection: &Connection, stopped: &mpsc::Receiver<()>) {
    // Told once, not every interval, while checkpoints keep failing.
    let mut failing = false;
    let mut interval = IDLE_CHECKPOINT_INTERVAL;
    // The WAL's frames at the last checkpoint: when they have not changed,
    // nothing was written since.
    let mut frames_before = None;
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
        match page_bytes(connection).and_then(|bytes| checkpoint_once(connection, bytes)) {
            Ok(frames) => {
                failing = false;
                interval = if frames_before == Some(frames) {
                    IDLE_CHECKPOINT_INTERVAL
                } else {
                    BUSY_CHECKPOINT_INTERVAL
                };
                frames_before = Some(frames);
            }
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(error = %error, "a SQLite WAL checkpoint failed; retrying");
            }
            Err(_) => {}
        }
    }
}

/// Frames left for the RESTART to copy while it holds writes off: about
/// a millisecond of commits at one connection.
const FRAMES_LEFT_FOR_RESTART: i64 = 64;

/// PASSIVE passes before a RESTART at most, however fast commits come.
const MAX_PASSES: usize = 6;

/// One checkpoint of a file with pages of `page_bytes`: a PASSIVE one
/// beside the store's commits, and when the WAL has grown past
/// [`WAL_RESTART_BYTES`], a RESTART that sets it back to its start.
/// Answers the frames in the WAL after it.
///
/// Why the RESTART: SQLite rewinds the WAL only when a transaction begins
/// with every frame already copied, and a PASSIVE checkpoint never gets
/// there while the store commits every millisecond (the frames written
/// during its copy are left). The WAL then grew to [`WAL_BOUND_BYTES`] and
/// the commit that crossed it copied it all itself, a 40 to 60 ms stall
/// every few seconds.
///
/// The RESTART holds the store's writes off while it copies what is left
/// and syncs, so PASSIVE passes come first, each copying what came during
/// the one before, until what is left is about a millisecond of commits
/// ([`FRAMES_LEFT_FOR_RESTART`]). A single pass before it left some
/// hundreds of frames: a writer held off for milliseconds at each rewind.
fn checkpoint_once(connection: &Connection, page_bytes: i64) -> rusqlite::Result<i64> {
    // The frames in the WAL when the pass began (its row: busy, frames,
    // frames copied); each pass copies those.
    let passive = || {
        connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            row.get::<_, i64>(1)
        })
    };
    let mut frames = passive()?;
    if frames * page_bytes < WAL_RESTART_BYTES {
        return Ok(frames);
    }
    for _ in 0..MAX_PASSES {
        let frames_before = frames;
        frames = passive()?;
        // A rewind elsewhere (another process sharing the file) starts
        // the count again: nothing is left then either.
        if frames - frames_before <= FRAMES_LEFT_FOR_RESTART {
            break;
        }
    }
    connection.query_row("PRAGMA wal_checkpoint(RESTART)", [], |row| {
        row.get::<_, i64>(1)
    })
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
        // WAL_BOUND_BYTES, which checkpointed them all itself.
        let page_bytes = 1024;
        let mut frames_before = 0;
        let mut calls = 0u64;
        loop {
            store.top_up("acct", 1).await.unwrap();
            calls += 1;
            let frames = wal_frames(&path);
            if frames < frames_before && i64::from(frames_before) * page_bytes >= WAL_RESTART_BYTES
            {
                break;
            }
            assert!(
                i64::from(frames) * page_bytes < WAL_BOUND_BYTES,
                "the WAL reached {frames} frames after {calls} commits without being rewound"
            );
            frames_before = frames;
        }
    }
}
