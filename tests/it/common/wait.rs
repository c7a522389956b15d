//! Waiting for a condition instead of for a fixed time: a test that has to
//! see something happen (a settlement land, a hold lapse, a process come
//! back) asks for it every [`POLL`] until it holds, and fails with what it
//! last saw once `within` has passed. A passing test waits only as long as
//! the thing it waits for takes; the bound is for the failing one, so it
//! is generous (a machine busy with other builds is slow).

#![allow(dead_code)]

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// Between two looks.
pub const POLL: Duration = Duration::from_millis(20);

/// The usual bound: far past what any condition waited for here takes on
/// a loaded machine, so that only a condition that never comes fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Waits until `holds` answers true, asking every [`POLL`]; fails the test
/// after `within`, saying it waited for `what`.
pub async fn wait_until<F, Fut>(within: Duration, what: impl Display, mut holds: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if holds().await {
            return;
        }
        assert!(Instant::now() < deadline, "waited {within:?} for {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until `look` answers `Ok`, asking every [`POLL`]; its value. Fails
/// the test after `within` with the last `Err` (what it saw instead).
pub async fn wait_for<T, F, Fut>(within: Duration, mut look: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + within;
    loop {
        match look().await {
            Ok(value) => return value,
            Err(seen) => assert!(Instant::now() < deadline, "waited {within:?}: {seen}"),
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`wait_until`] for code without a runtime (a thread reading a pipe, a
/// process starting): sleeps the thread between looks.
pub fn wait_until_blocking(within: Duration, what: impl Display, mut holds: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    loop {
        if holds() {
            return;
        }
        assert!(Instant::now() < deadline, "waited {within:?} for {what}");
        std::thread::sleep(POLL);
    }
}

/// Whether `holds` came to answer true within `within`, asking every
/// [`POLL`], without failing the test: for a wait whose end is only a
/// courtesy (reading the rest of a pipe before failing anyway).
pub fn waited_blocking(within: Duration, mut holds: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if holds() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// [`wait_for`] without a runtime.
pub fn wait_for_blocking<T>(within: Duration, mut look: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + within;
    loop {
        match look() {
            Ok(value) => return value,
            Err(seen) => assert!(Instant::now() < deadline, "waited {within:?}: {seen}"),
        }
        std::thread::sleep(POLL);
    }
}
