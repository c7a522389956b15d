//! The example binaries, which some tests run as processes.

#![allow(dead_code)]

use std::path::PathBuf;

/// The path of the built example `name`; a clear failure when it is missing.
pub fn binary(name: &str) -> PathBuf {
    let deps = std::env::current_exe().expect("the test's own path");
    let binary = deps
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .join("examples")
        .join(name);
    assert!(
        binary.exists(),
        "{} is missing: run `cargo build --examples` first, as ./scripts/test.sh does",
        binary.display()
    );
    binary
}
