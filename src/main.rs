//! `keyward`: command-line entry point.

use std::process::ExitCode;

use clap::Parser;
use keyward::config::{Cli, Command, GrpcProxyCommand};

fn main() -> ExitCode {
    let cli = Cli::parse_from(keyward::config::etcd_style_args(std::env::args_os()));
    match cli.command {
        Command::Serve(args) => {
            let config = match args.into_config() {
                Ok(config) => config,
                Err(e) => {
                    eprintln!("keyward: {e}");
                    return ExitCode::from(2);
                }
            };
            init_logging(config.log_filter);
            run(keyward::serve(config))
        }
        Command::GrpcProxy(GrpcProxyCommand::Start(args)) => {
            let config = match args.into_config() {
                Ok(config) => config,
                Err(e) => {
                    eprintln!("keyward grpc-proxy: {e}");
                    return ExitCode::from(2);
                }
            };
            init_logging(config.log_filter);
            run(keyward::proxy::run(config))
        }
        Command::Snapshot(command) => {
            init_logging("warn");
            report("keyward snapshot", keyward::snapshot_cli::run(command))
        }
        Command::Migrate(args) => {
            init_logging("warn");
            report("keyward migrate", keyward::migrate::run(*args))
        }
    }
}

/// Runs `task` on a multi-threaded runtime; its error is logged and makes the exit status 1.
fn run(task: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("keyward: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("keyward: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A one-shot command's outcome: its error printed once, naming the command; exit status 1.
fn report(command: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{command}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KEYWARD_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{default},openraft=warn,h2=warn,tower=warn,hyper=warn"))
    });
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}
