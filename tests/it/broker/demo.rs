//! The quick start works: `scripts/demo --check` publishes sample orders and sees their runs.

use std::process::Command;

use crate::support::{binary, repo};

#[tokio::test]
async fn demo_script_shows_runs_starting() {
    let out = tokio::task::spawn_blocking(|| {
        Command::new(repo().join("scripts/demo"))
            .arg("--check")
            .env("TESSEL_KAFKA_BIN", binary())
            .env(
                "DEMO_DISPATCHER_PORT",
                crate::support::free_port().to_string(),
            )
            .env("DEMO_ADMIN_PORT", crate::support::free_port().to_string())
            .env("DEMO_COUNT", "12")
            .output()
            .expect("run scripts/demo")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scripts/demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("run accepted workflow=process-order"))
            .count(),
        12,
        "{stdout}"
    );
    assert!(stdout.contains("OK: 12 orders started 12 runs"));
}
