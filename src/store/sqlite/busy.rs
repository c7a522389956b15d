//! Waiting for another connection's lock in small steps. SQLite's own
//! busy timeout sleeps 1, 2, 5, 10, 15 … ms between attempts, so a writer
//! held off for half a millisecond (by the checkpointer's WAL rewind, or
//! by another process's commit) slept 8 or 18 ms: most of the store's
//! tail at one connection. These steps are a tenth of a millisecond at
//! first, then a millisecond, within the store's `busy_timeout`.

use std::cell::Cell;
use std::time::Duration;

use rusqlite::Connection;

/// The fine steps, and how many of them before the coarse ones.
const FINE_STEP: Duration = Duration::from_micros(100);
const FINE_STEPS: u32 = 100;
const COARSE_STEP: Duration = Duration::from_millis(1);

thread_local! {
    /// How long a statement on this thread waits for a lock, in all: the
    /// handler SQLite calls is a plain function, so the limit is the
    /// thread's (each of the store's connections has a thread of its own).
    static WAIT_LIMIT: Cell<Duration> = const { Cell::new(Duration::from_secs(5)) };
}

/// Makes `connection` wait for locks in small steps, up to the limit of
/// the thread the statement runs on ([`limit_waits_on_this_thread`]).
pub(super) fn wait_in_small_steps(connection: &Connection) -> rusqlite::Result<()> {
    connection.busy_handler(Some(wait_once))
}

/// Sets how long statements on this thread wait for a lock.
pub(super) fn limit_waits_on_this_thread(limit: Duration) {
    WAIT_LIMIT.with(|cell| cell.set(limit));
}

/// SQLite's busy handler: `attempts` before this one were refused; waits
/// one step and asks for another attempt, or gives up (`SQLITE_BUSY`) once
/// the steps slept reach the limit.
fn wait_once(attempts: i32) -> bool {
    let Some(step) = step_after(attempts.max(0) as u32, WAIT_LIMIT.with(Cell::get)) else {
        return false;
    };
    std::thread::sleep(step);
    true
}

/// The step to sleep after `attempts` refused attempts, or `None` once
/// the steps before it already add up to `limit`.
fn step_after(attempts: u32, limit: Duration) -> Option<Duration> {
    let fine = attempts.min(FINE_STEPS);
    let slept = FINE_STEP * fine + COARSE_STEP * (attempts - fine);
    if slept >= limit {
        return None;
    }
    Some(if attempts < FINE_STEPS {
        FINE_STEP
    } else {
        COARSE_STEP
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_fine_first_then_coarse_and_stop_at_the_limit() {
        let limit = Duration::from_millis(50);
        assert_eq!(step_after(0, limit), Some(FINE_STEP));
        assert_eq!(step_after(FINE_STEPS - 1, limit), Some(FINE_STEP));
        assert_eq!(step_after(FINE_STEPS, limit), Some(COARSE_STEP));
        // 100 × 0.1 ms + 39 × 1 ms = 49 ms slept: one more step.
        assert_eq!(step_after(FINE_STEPS + 39, limit), Some(COARSE_STEP));
        assert_eq!(step_after(FINE_STEPS + 40, limit), None);
        assert_eq!(step_after(0, Duration::ZERO), None);
    }

    #[test]
    fn a_writer_gives_up_at_its_limit() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("busy.db");
        let holder = Connection::open(&path).unwrap();
        holder.pragma_update(None, "journal_mode", "WAL").unwrap();
        holder.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        let waiter = Connection::open(&path).unwrap();
        wait_in_small_steps(&waiter).unwrap();
        limit_waits_on_this_thread(Duration::from_millis(20));
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let error = waiter.execute_batch("BEGIN IMMEDIATE").unwrap_err();
        assert_eq!(
            error.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy)
        );
    }
}
