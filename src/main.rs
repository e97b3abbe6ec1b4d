//! The `filedock` binary: `serve` (default) and `user create NAME`.

use clap::{Parser, Subcommand};
use filedock::{
    config::Settings,
    domain::users,
    startup::{Application, open_metadata, shutdown_signal},
    telemetry,
};

#[derive(Parser)]
#[command(
    version,
    about = "File-upload backend: many concurrent writers, nothing lost"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP server (the default).
    Serve,
    /// Manage users.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
}

#[derive(Subcommand)]
enum UserCommand {
    /// Create a user and print its API key (shown once).
    Create { name: String },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let settings = Settings::from_env()?;
    telemetry::init(settings.log_json);
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            let app = Application::build(settings).await?;
            app.run_until_stopped(shutdown_signal()).await
        }
        Command::User {
            command: UserCommand::Create { name },
        } => {
            let meta = open_metadata(&settings).await?;
            let (user, key) = users::create_user(meta.as_ref(), &name).await?;
            println!(
                "{}",
                serde_json::json!({"id": user.id, "name": user.name, "api_key": key})
            );
            Ok(())
        }
    }
}
