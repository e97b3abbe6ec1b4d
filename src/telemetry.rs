//! Tracing setup: `RUST_LOG` filter (default `info`), text or JSON output,
//! on stderr — stdout carries the commands' own output (`sweep`'s JSON report).
//! Text is coloured only on a terminal: a log that goes to a file or a pipe
//! (cron, systemd, a container runtime) stays plain.

use std::io::IsTerminal;

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let _ = if json {
        registry
            .with(
                fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_writer(std::io::stderr),
            )
            .try_init()
    } else {
        registry
            .with(
                fmt::layer()
                    .with_target(false)
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .try_init()
    };
}
