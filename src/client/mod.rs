//! The command-line client: `filedock upload|ls|get|rm` against a running
//! filedock, with progress bars and answers a script can use (`--json`, exit
//! codes). It speaks only the public HTTP API; nothing here is the server's.

mod api;
mod resumable;
mod transfer;

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Subcommand};
use futures::{StreamExt, stream};
use indicatif::MultiProgress;
use serde_json::{Value, json};

use self::api::{Api, Failure};

/// Where the server is and who is asking.
#[derive(Args, Clone)]
pub struct Remote {
    /// The filedock server.
    #[arg(
        long,
        env = "FILEDOCK_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub url: String,
    /// The user's API key.
    #[arg(long, env = "FILEDOCK_API_KEY", hide_env_values = true, global = true)]
    pub api_key: Option<String>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum ClientCommand {
    /// Upload files (several at a time), optionally attaching each to a session or an agent.
    Upload {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long)]
        session: Option<String>,
        #[arg(long)]
        agent: Option<String>,
        /// How many uploads run at once.
        #[arg(long, default_value_t = 4)]
        parallel: usize,
    },
    /// List your files.
    Ls,
    /// Download a file (to its own name in the current directory, or `-o PATH`).
    Get {
        id: String,
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Delete files.
    Rm {
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

pub async fn run(remote: Remote, command: ClientCommand) -> ExitCode {
    let Some(key) = remote.api_key.clone() else {
        eprintln!("filedock: set FILEDOCK_API_KEY or pass --api-key");
        return ExitCode::from(2);
    };
    let api = Api::new(remote.url.trim_end_matches('/'), &key);
    let results: Vec<Result<Value, Failure>> = match command {
        ClientCommand::Upload {
            files,
            session,
            agent,
            parallel,
        } => {
            let bars = MultiProgress::new();
            let (api, bars) = (&api, &bars);
            let (session, agent) = (session.as_deref(), agent.as_deref());
            stream::iter(files)
                .map(|path| async move {
                    let file = api.upload(&path, bars).await?;
                    let id = file["id"].as_str().unwrap_or_default();
                    if let Some(s) = session {
                        api.attach("sessions", s, id).await?;
                    }
                    if let Some(a) = agent {
                        api.attach("agents", a, id).await?;
                    }
                    Ok(file)
                })
                .buffered(parallel.max(1))
                .collect()
                .await
        }
        ClientCommand::Ls => vec![api.list().await.map(Value::Array)],
        ClientCommand::Get { id, output } => vec![api.download(&id, output).await],
        ClientCommand::Rm { ids } => {
            let mut done = Vec::new();
            for id in ids {
                done.push(
                    api.delete(&id)
                        .await
                        .map(|()| json!({"id": id, "deleted": true})),
                );
            }
            done
        }
    };
    report(&results, remote.json)
}

/// Prints every result (stdout) and failure (stderr); the worst exit code.
fn report(results: &[Result<Value, Failure>], as_json: bool) -> ExitCode {
    let mut code = 0;
    for r in results {
        match r {
            Ok(v) if as_json => println!("{v}"),
            Ok(Value::Array(files)) => files.iter().for_each(|f| println!("{}", line(f))),
            Ok(v) => println!("{}", line(v)),
            Err(f) => {
                eprintln!("filedock: {}", f.message());
                code = code.max(f.code());
            }
        }
    }
    ExitCode::from(code)
}

/// One file as a line: id, size, name (or what a command reports).
fn line(v: &Value) -> String {
    match (v["id"].as_str(), v["size"].as_u64(), v["filename"].as_str()) {
        (Some(id), Some(size), Some(name)) => format!("{id}\t{size}\t{name}"),
        _ => v.to_string(),
    }
}
