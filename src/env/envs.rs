//! `swerve-train envs ...`: managing environments outside a run.

use super::kubernetes::cli::KubernetesArgs;
use super::kubernetes::config::parse_run_id;
use super::kubernetes::{self, KubernetesConfig};
use super::Limits;
use anyhow::Result;

/// What `swerve-train envs` does.
#[derive(clap::Subcommand, Debug)]
pub enum EnvsCommand {
    /// Deletes the pods a run left behind (a run killed before it could delete them), by their
    /// swerve.run label, and waits until they are gone (kubernetes).
    Sweep {
        /// The run whose pods go (printed at its start; the swerve.run label).
        #[arg(long, value_parser = parse_run_id, required_unless_present = "all", conflicts_with = "all")]
        run: Option<String>,
        /// Every swerve pod of the namespace, of any run.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        kubernetes: KubernetesArgs,
    },
}

/// Runs an `envs` command.
pub fn run(command: &EnvsCommand) -> Result<()> {
    match command {
        EnvsCommand::Sweep {
            run,
            all: _,
            kubernetes: args,
        } => {
            let config = KubernetesConfig::new(Limits::default(), args.options());
            let (namespace, count) = kubernetes::sweep(&config, run.as_deref())?;
            let which = match run {
                Some(run) => format!("of run {run}"),
                None => "of every run".to_string(),
            };
            println!("deleted {count} pods {which} in namespace {namespace}");
        }
    }
    Ok(())
}
