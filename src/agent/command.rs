//! `swerve-train rollout` and `swerve-train eval`: tasks, an environment, a policy, episodes,
//! then `trajectories.jsonl` (RL-SPEC's format; `rft` and `dapo` read it) and a summary.

use super::episode::{Episode, EpisodeConfig, EpisodeContext};
use super::policy::{read_replay, EnginePolicy, Policy, Script, ScriptedPolicy, ServerPolicy};
use super::rollout::{print_summary, run_episodes, summarize, Workers};
use super::sampling::{launch_rollout_engine, ModelLimits};
use crate::backend::DeviceChoice;
use crate::chat::ChatTemplate;
use crate::config::ModelConfig;
use crate::engine::EngineHandle;
use crate::env::docker::{DockerConfig, DockerEnvironment};
use crate::env::kubernetes::{KubernetesConfig, KubernetesEnvironment, KubernetesOptions};
use crate::env::local::{LocalConfig, LocalEnvironment};
use crate::env::toy::ToyEnvironment;
use crate::env::{builtin, load_tasks, EnvKind, Environment, Limits, RepoSource, Task};
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Everything `rollout` and `eval` take.
#[derive(Clone, Debug)]
pub struct AgentRunOptions {
    /// Model folder or `preset:NAME`; only the tokenizer is read for scripted policies (the
    /// embedded Qwen2.5 tokenizer without a model).
    pub model: Option<PathBuf>,
    /// A task file or `builtin:NAME`.
    pub tasks: String,
    pub out: PathBuf,
    pub group: usize,
    pub episode: EpisodeConfig,
    /// `None`: the model's context, at most 65,536.
    pub max_context: Option<usize>,
    pub env: EnvKind,
    pub limits: Limits,
    pub sandbox_binds: Vec<PathBuf>,
    pub docker_image: String,
    /// The docker CLI (or `podman`).
    pub docker_cli: PathBuf,
    /// `--env kubernetes`'s cluster, namespace and pod options.
    pub kubernetes: KubernetesOptions,
    /// Sequences the in-process engine generates at once (its batch limit).
    pub concurrency: usize,
    /// Episodes (sandboxes) at once, and sandboxes started ahead.
    pub workers: Workers,
    pub seed: u64,
    /// `model`, `oracle`, `noop` or `replay:FILE`.
    pub policy: String,
    pub server: Option<String>,
    pub api_key: Option<String>,
    pub device: DeviceChoice,
    pub only_resolved: bool,
    /// Only the first N tasks of the file.
    pub limit_tasks: Option<usize>,
    /// The SWE-bench harness rules the judge follows (`--swebench-rules`).
    pub swebench_rules: crate::env::HarnessRules,
    /// Every flag's final value as TOML ([`crate::cli::ResolvedConfig`]), written to
    /// `OUT/config.toml` (by `rl` once OUT is ready and a resume's check has passed); `None`:
    /// no file.
    pub resolved_config: Option<String>,
}

/// The environment named by `--env`.
pub fn make_environment(
    kind: EnvKind,
    limits: &Limits,
    binds: &[PathBuf],
    image: &str,
    docker_cli: &Path,
    kubernetes: &KubernetesOptions,
) -> Result<Box<dyn Environment>> {
    Ok(match kind {
        EnvKind::Local => {
            let mut config = LocalConfig::new(limits.clone());
            config.read_only_binds = binds.to_vec();
            Box::new(LocalEnvironment::new(config)?)
        }
        EnvKind::Docker => {
            let mut config = DockerConfig::new(limits.clone());
            config.default_image = image.to_string();
            config.docker = docker_cli.to_path_buf();
            Box::new(DockerEnvironment::new(config)?)
        }
        EnvKind::Kubernetes => {
            let mut config = KubernetesConfig::new(limits.clone(), kubernetes.clone());
            config.default_image = image.to_string();
            let env = KubernetesEnvironment::new(config)?;
            eprintln!(
                "kubernetes: run {} in namespace {} (its pods, should it be killed: swerve-train envs sweep --run {} --k8s-namespace {})",
                env.run_id(),
                env.namespace(),
                env.run_id(),
                env.namespace()
            );
            Box::new(env)
        }
    })
}

/// The toy environment for toy tasks (they run in process), else the one `--env` names.
pub fn environment_for(tasks: &[Task], options: &AgentRunOptions) -> Result<Box<dyn Environment>> {
    let toys = tasks
        .iter()
        .filter(|t| matches!(t.repo, RepoSource::Toy { .. }))
        .count();
    if toys == tasks.len() {
        return Ok(Box::new(ToyEnvironment::new(options.limits.clone())));
    }
    if toys > 0 {
        bail!(
            "{}: toy tasks and repository tasks cannot be mixed in one run",
            options.tasks
        );
    }
    make_environment(
        options.env,
        &options.limits,
        &options.sandbox_binds,
        &options.docker_image,
        &options.docker_cli,
        &options.kubernetes,
    )
}

/// What a run produced: its episodes' summary (also written to OUT).
pub struct AgentRun {
    pub summary: serde_json::Value,
    pub trajectories: PathBuf,
}

/// Runs the episodes and writes `OUT/trajectories.jsonl` and `OUT/{name}.json`.
pub fn run_agent(options: &AgentRunOptions, name: &str) -> Result<AgentRun> {
    if options.group == 0 || options.concurrency == 0 || options.workers.sandboxes == 0 {
        bail!("--group, --concurrency and --sandboxes must be at least 1");
    }
    if options.episode.max_turns == 0 || options.episode.max_turn_tokens == 0 {
        bail!("--max-turns and --max-turn-tokens must be at least 1");
    }
    std::fs::create_dir_all(&options.out)
        .with_context(|| format!("creating {}", options.out.display()))?;
    if let Some(text) = &options.resolved_config {
        crate::train::run_dir::write_config(&options.out, text)?;
    }
    let tasks_path = builtin::resolve_tasks(&options.tasks)?;
    let mut tasks = load_tasks(&tasks_path)?;
    options.swebench_rules.apply(&mut tasks);
    if let Some(n) = options.limit_tasks {
        tasks.truncate(n.max(1));
    }

    let model_dir = options
        .model
        .as_ref()
        .map(|m| crate::train::run_dir::resolve_model(m, &options.out))
        .transpose()?;
    let tokenizer = Arc::new(match &model_dir {
        Some(dir) => Tokenizer::for_model_dir(dir)?,
        None => Tokenizer::qwen25()?,
    });
    let template = ChatTemplate::for_tokenizer(&tokenizer)?;

    let mut episode = options.episode.clone();
    let (policy, engine) = make_policy(options, &tokenizer, model_dir.as_ref(), &mut episode)?;
    if options.policy != "model" {
        if let Some(n) = options.max_context {
            episode.max_context = n;
        }
    }
    let env = environment_for(&tasks, options)?;
    eprintln!(
        "{name}: {} tasks from {} x {} samples, policy {}, environment {}, {} sandboxes at a time ({} started ahead), engine batch {}, context {} tokens, {} turns",
        tasks.len(),
        if builtin::is_builtin_path(&tasks_path) { options.tasks.clone() } else { tasks_path.display().to_string() },
        options.group,
        policy.name(),
        env.name(),
        options.workers.sandboxes,
        options.workers.warm_pool,
        options.concurrency,
        episode.max_context,
        episode.max_turns
    );
    let ctx = EpisodeContext {
        env: env.as_ref(),
        policy: policy.as_ref(),
        tokenizer: &tokenizer,
        template: &template,
        config: &episode,
    };
    let episodes = run_episodes(
        &ctx,
        &tasks,
        options.group,
        options.workers,
        options.seed,
        name,
    );
    drop(policy);
    if let Some(handle) = engine {
        if let Ok(handle) = Arc::try_unwrap(handle) {
            handle.shutdown();
        }
    }

    write_outputs(options, name, &tasks, &episodes, env.name(), &episode)
}

/// A policy, and the in-process engine it samples from (if any), to shut down after.
type PolicyAndEngine = (Box<dyn Policy>, Option<Arc<EngineHandle>>);

/// The policy `--policy` names: the model (through an in-process engine, returned too so it can
/// be shut down, or `--server`), or a scripted one. For the model, the episodes' context limit
/// is set from the model's.
fn make_policy(
    options: &AgentRunOptions,
    tokenizer: &Arc<Tokenizer>,
    model_dir: Option<&PathBuf>,
    episode: &mut EpisodeConfig,
) -> Result<PolicyAndEngine> {
    let mut engine = None;
    let policy: Box<dyn Policy> = match options.policy.as_str() {
        "noop" => Box::new(ScriptedPolicy {
            tokenizer: tokenizer.clone(),
            script: Script::Noop,
        }),
        "oracle" => Box::new(ScriptedPolicy {
            tokenizer: tokenizer.clone(),
            script: Script::Oracle,
        }),
        "model" => {
            let dir = model_dir.ok_or_else(|| {
                anyhow::anyhow!("--policy model needs --model DIR or --model preset:NAME")
            })?;
            let limits =
                ModelLimits::new(&ModelConfig::from_dir(dir)?, tokenizer, options.max_context)?;
            episode.max_context = limits.max_context;
            match &options.server {
                Some(url) => Box::new(ServerPolicy::new(
                    url,
                    options.api_key.clone(),
                    limits.stop_ids,
                )?),
                None => {
                    let handle = Arc::new(launch_rollout_engine(
                        dir,
                        options.device,
                        limits.max_context,
                        options.concurrency,
                        options.seed,
                        1,
                    )?);
                    engine = Some(handle.clone());
                    Box::new(EnginePolicy {
                        engine: handle,
                        stop_ids: limits.stop_ids,
                        temperature: 1.0,
                    })
                }
            }
        }
        other => match other.strip_prefix("replay:") {
            Some(file) => Box::new(ScriptedPolicy {
                tokenizer: tokenizer.clone(),
                script: Script::Replay(read_replay(Path::new(file))?),
            }),
            None => bail!("--policy {other}: expected model, oracle, noop or replay:FILE"),
        },
    };
    Ok((policy, engine))
}

/// Writes SWE-bench's predictions files, one per sample index (`OUT/predictions/sample-K.jsonl`,
/// a line per task: `instance_id`, `model_name_or_path`, `model_patch`), so that each is one run
/// of the official harness and pass@1 can be reported over several. Returns the paths.
fn write_predictions(options: &AgentRunOptions, episodes: &[Episode]) -> Result<Vec<String>> {
    let dir = options.out.join("predictions");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let model = match &options.model {
        Some(m) if options.policy == "model" => m.display().to_string(),
        _ => format!("swerve-{}", options.policy),
    };
    let mut paths = Vec::new();
    for sample in 0..options.group {
        let path = dir.join(format!("sample-{sample}.jsonl"));
        crate::jsonl::write_atomically(&path, |write| {
            for e in episodes.iter().filter(|e| e.sample == sample) {
                write(&json!({
                    "instance_id": e.task_id,
                    "model_name_or_path": model,
                    "model_patch": e.patch.as_ref().map_or("", |d| d.patch.as_str()),
                }))?;
            }
            Ok(())
        })?;
        paths.push(path.display().to_string());
    }
    Ok(paths)
}

/// Writes `OUT/trajectories.jsonl` and `OUT/{name}.json` and prints the summary.
fn write_outputs(
    options: &AgentRunOptions,
    name: &str,
    tasks: &[Task],
    episodes: &[Episode],
    environment: &str,
    episode: &EpisodeConfig,
) -> Result<AgentRun> {
    let trajectories = options.out.join("trajectories.jsonl");
    crate::jsonl::write_atomically(&trajectories, |write| {
        for e in episodes {
            if !options.only_resolved || e.resolved {
                write(&e.to_json())?;
            }
        }
        Ok(())
    })?;
    let mut summary = summarize(tasks, episodes, options.group);
    summary["policy"] = json!(options.policy);
    // The model whose tokenizer the token ids are in (`null`: the embedded Qwen2.5 tokenizer):
    // `swerve-train report` decodes them with it.
    summary["model"] = json!(options
        .model
        .as_deref()
        .map(crate::train::run_dir::model_source));
    summary["tasks_file"] = json!(options.tasks);
    summary["environment"] = json!(environment);
    summary["seed"] = json!(options.seed);
    summary["max_context"] = json!(episode.max_context);
    summary["max_turns"] = json!(episode.max_turns);
    summary["suspicious_reward"] = json!(episode.suspicious_reward.as_str());
    summary["trajectories_written"] = json!(episodes
        .iter()
        .filter(|e| !options.only_resolved || e.resolved)
        .count());
    if name == "eval" {
        summary["predictions"] = json!(write_predictions(options, episodes)?);
    }
    let summary_path = options.out.join(format!("{name}.json"));
    std::fs::write(
        &summary_path,
        serde_json::to_string_pretty(&summary)? + "\n",
    )
    .with_context(|| format!("writing {}", summary_path.display()))?;
    print_summary(&summary);
    eprintln!(
        "wrote {} and {}",
        trajectories.display(),
        summary_path.display()
    );
    Ok(AgentRun {
        summary,
        trajectories,
    })
}
