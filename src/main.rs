//! The `filedock` binary: the server (`serve`, the default; `sweep`,
//! `reconcile`, `user create NAME`) and its command-line client (`upload`,
//! `ls`, `get`, `rm`).

mod client;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use filedock::{
    config::{self, Settings},
    domain::{sweeper::Outcome, users},
    http::AppState,
    startup::{Application, open_metadata, shutdown_signal},
    telemetry,
};

#[derive(Parser)]
#[command(
    version,
    about = "File-upload backend: many concurrent writers, nothing lost",
    after_help = settings_help()
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    remote: client::Remote,
}

/// The server's settings for `--help`: every one, with its variable and default.
fn settings_help() -> String {
    let mut help = String::from("Server settings (environment variables):\n");
    for s in config::SETTINGS {
        help.push_str(&format!(
            "  {:<36} {} [default: {}]\n",
            s.var,
            s.meaning,
            s.shown_default()
        ));
    }
    help
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP server (the default).
    Serve,
    /// Run one sweeper pass (for cron): abandoned uploads and orphaned blobs.
    /// Prints a JSON summary; exits non-zero if the pass failed or an orphan
    /// was given up on.
    Sweep,
    /// Audit the bucket against the metadata; prints a JSON report.
    Reconcile {
        /// Delete objects that have neither a file record nor an upload in flight.
        #[arg(long)]
        delete: bool,
    },
    /// Manage users.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    #[command(flatten)]
    Client(client::ClientCommand),
}

#[derive(Subcommand)]
enum UserCommand {
    /// Create a user and print its API key (shown once).
    Create { name: String },
}

/// glibc raises its mmap threshold each time a large block is freed, so the
/// 8 MiB multipart buffers end up carved from the heap arenas, which keep
/// the memory after it is freed. A fixed 1 MiB threshold maps every large
/// buffer on its own and returns it on free: peak RSS through a 1 GiB upload
/// went from 91 to 70 MiB (`scripts/bench.sh 5`), same throughput.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; any value is valid.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Serve);
    if let Command::Client(c) = command {
        return Ok(client::run(cli.remote, c).await);
    }
    serve(command).await.map(|()| ExitCode::SUCCESS)
}

/// The server's commands.
async fn serve(command: Command) -> anyhow::Result<()> {
    tune_allocator();
    let settings = Settings::from_env()?;
    telemetry::init(settings.log_json);
    // Names only: a value may be a secret.
    let names = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok());
    for unknown in settings.check_variables(names)? {
        tracing::warn!("{unknown}");
    }
    for (name, older) in config::OLDER_NAMES {
        if std::env::var_os(older).is_some() {
            tracing::warn!(
                "{older} is the older name of FILEDOCK_{name}; it is read while that is unset"
            );
        }
    }
    match command {
        Command::Serve => {
            let app = Application::build(settings).await?;
            app.run_until_stopped(shutdown_signal()).await
        }
        Command::Sweep => {
            let state = AppState::build(settings).await?;
            let outcome = state.sweeper.try_run_once().await?;
            println!("{}", serde_json::to_string(&outcome)?);
            match outcome {
                Outcome::Swept(r) if r.orphans_failed > 0 => std::process::exit(1),
                _ => Ok(()),
            }
        }
        Command::Reconcile { delete } => {
            let state = AppState::build(settings).await?;
            let report = state.reconciler.reconcile(delete).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        Command::User {
            command: UserCommand::Create { name },
        } => {
            let meta = open_metadata(&settings).await?;
            let (user, key) = users::create_user(meta.as_ref(), &name).await?;
            println!(
                "{}",
                serde_json::json!({"id": user.id, "name": user.name, "api_key": key.secret, "key_id": key.record.id})
            );
            Ok(())
        }
        Command::Client(_) => unreachable!("handled in main"),
    }
}
