//! The engine: the scheduler's plan, one paged forward pass, sampling, events.
//!
//! ```text
//!  submit ──► Scheduler (waiting ─► running) ──plan──► Qwen2Model::forward_paged over PagedKv
//!                 ▲                                          │ hidden rows of caught-up requests
//!                 └── sampled token appended ◄── sampler ◄── LM head (fp32 logits)
//! ```
//!
//! [`Engine`] is synchronous: [`Engine::step`] runs one step and returns what happened. The
//! [`super::EngineHandle`] runs it on its own thread behind channels, for the server and the RL loop.

use crate::backend::{Backend, PagedLayout, RowDraw};
use crate::engine::prompt_logprobs::{score_rows, PromptLogprobs, PromptRow};
use crate::engine::request::{FinishReason, GenerationRequest, Request, RequestOptions};
use crate::engine::sampler::{sample, Sample, SampleRng, SamplingParams};
use crate::engine::scheduler::{Scheduler, SchedulerConfig, StepPlan};
use crate::kvcache::{KvCacheManager, RequestId, DEFAULT_BLOCK_SIZE};
use crate::model::{PagedKv, Qwen2Model};
use anyhow::{bail, ensure, Context, Result};
use std::collections::HashMap;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub block_size: usize,
    /// Blocks in the KV pools, the null block included.
    pub num_blocks: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// Longest prompt + output; at most the model's context.
    pub max_model_len: usize,
    /// Seeds the samplers of requests that bring no seed of their own.
    pub seed: u64,
    pub enable_prefix_caching: bool,
    /// Replay pure decode steps from captured CUDA graphs where the backend has them
    /// (`Backend::decode_step_graph`); a no-op on the CPU. Default on.
    pub cuda_graphs: bool,
    /// Evict cached prefixes before touching never-used KV blocks (a CPU cache, whose pages
    /// cost memory only once written; see `BlockPool::set_evict_before_touching`). Off by
    /// default; `swerve-serve` turns it on for the CPU backend.
    pub evict_before_touching: bool,
}

impl EngineConfig {
    /// Defaults for a model: 16-token blocks, 256 sequences, 8,192 tokens per step.
    pub fn for_model(max_model_len: usize, num_blocks: usize) -> Self {
        Self {
            block_size: DEFAULT_BLOCK_SIZE,
            num_blocks,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len,
            seed: 0,
            enable_prefix_caching: true,
            cuda_graphs: true,
            evict_before_touching: false,
        }
    }
}

/// A generated token, as it is produced.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEvent {
    pub id: RequestId,
    pub token: u32,
    pub logprob: f32,
    pub top_logprobs: Vec<(u32, f32)>,
    /// The weight version the token was sampled under.
    pub weight_version: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// Everything about a finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct FinalRecord {
    pub id: RequestId,
    pub prompt_tokens: Vec<u32>,
    pub output_tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub num_preemptions: usize,
    pub weight_version: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// A request's prompt logprobs (asked for with `prompt_logprobs`), once, before its tokens.
    PromptLogprobs {
        id: RequestId,
        logprobs: PromptLogprobs,
    },
    Token(TokenEvent),
    Finished(FinalRecord),
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    /// Submissions the engine thread holds while paused, not yet in the engine (they start on
    /// resume; see [`crate::engine::handle`]). Always 0 from [`Engine::stats`].
    pub held: usize,
    pub kv_used_blocks: usize,
    pub kv_total_blocks: usize,
    /// The KV cache's memory is allocated (false while released: a sleep, or
    /// [`Engine::release_kv_cache`]).
    pub kv_cache_allocated: bool,
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub steps: u64,
    pub generated_tokens: u64,
    pub preemptions: u64,
    pub last_step_seconds: f64,
    /// Wall time of all steps, and of their model work (the paged forward, the LM head,
    /// sampling and the copy of its results to the host, which waits for the device): the rest
    /// is host overhead (scheduling, layouts, bookkeeping).
    pub total_step_seconds: f64,
    pub total_model_seconds: f64,
    pub weight_version: u64,
    /// Steps replayed from a captured CUDA graph (`EngineConfig::cuda_graphs`).
    pub graph_steps: u64,
}

pub struct Engine<B: Backend> {
    pub backend: B,
    pub model: Qwen2Model<B>,
    pub(super) kv: PagedKv<B::Tensor>,
    /// The KV cache's memory is given back (while a colocated trainer runs); the next step that
    /// has work allocates it again.
    kv_released: bool,
    /// The weights' memory is given back (sleep level 2, `super::sleep`): no request is
    /// accepted until they are loaded again.
    pub(super) weights_released: bool,
    pub(super) scheduler: Scheduler,
    config: EngineConfig,
    next_id: RequestId,
    pub(super) stats: EngineStats,
}

impl<B: Backend> Engine<B> {
    pub fn new(backend: B, model: Qwen2Model<B>, config: EngineConfig) -> Result<Self> {
        ensure!(
            config.max_model_len >= 2 && config.max_model_len <= model.config.max_context(),
            "max_model_len {} must be between 2 and the model's context of {}",
            config.max_model_len,
            model.config.max_context()
        );
        ensure!(
            config.max_num_seqs > 0 && config.max_num_batched_tokens > 0,
            "max_num_seqs and max_num_batched_tokens must be positive"
        );
        let mut manager = KvCacheManager::new(
            config.num_blocks,
            config.block_size,
            config.enable_prefix_caching,
        )?;
        manager.set_evict_before_touching(config.evict_before_touching);
        let kv = model
            .new_paged_kv(&backend, config.num_blocks, config.block_size)
            .context("allocating the KV cache")?;
        let scheduler = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: config.max_num_seqs,
                max_num_batched_tokens: config.max_num_batched_tokens,
                max_model_len: config.max_model_len,
            },
            manager,
        );
        let stats = EngineStats {
            kv_total_blocks: config.num_blocks - 1,
            ..Default::default()
        };
        Ok(Self {
            backend,
            model,
            kv,
            kv_released: false,
            weights_released: false,
            scheduler,
            config,
            next_id: 1,
            stats,
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Checks a request against the model and the engine's limits; every error names the field.
    pub fn validate(&self, request: &GenerationRequest) -> Result<()> {
        let vocab = self.model.config.vocab_size;
        ensure!(!request.prompt.is_empty(), "prompt: empty");
        if let Some((i, &t)) = request
            .prompt
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= vocab)
        {
            bail!("prompt: token {t} at position {i} is outside the vocabulary of {vocab}");
        }
        ensure!(request.max_tokens >= 1, "max_tokens: must be at least 1");
        ensure!(
            request.prompt.len() < self.config.max_model_len,
            "prompt: {} tokens leave no room to generate within max_model_len {}",
            request.prompt.len(),
            self.config.max_model_len
        );
        request
            .params
            .validate(vocab)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        self.scheduler
            .kv
            .check_fits(0, request.prompt.len() + 1)
            .map_err(|e| anyhow::anyhow!("prompt: {e}"))?;
        Ok(())
    }

    /// Queues a request; its events come out of later [`Engine::step`]s.
    pub fn add_request(&mut self, request: GenerationRequest) -> Result<RequestId> {
        self.add_request_with(request, RequestOptions::default())
    }

    /// [`Engine::add_request`] with `min_tokens`, a priority or a cache salt.
    pub fn add_request_with(
        &mut self,
        request: GenerationRequest,
        options: RequestOptions,
    ) -> Result<RequestId> {
        ensure!(
            !self.weights_released,
            "model: the weights are released (sleep level 2); wake the engine up first"
        );
        self.validate(&request)?;
        ensure!(
            options.min_tokens <= request.max_tokens,
            "min_tokens: {} is more than max_tokens {}",
            options.min_tokens,
            request.max_tokens
        );
        let id = self.next_id;
        self.next_id += 1;
        let seed = request
            .params
            .seed
            .unwrap_or_else(|| self.config.seed ^ id.wrapping_mul(crate::rng::GOLDEN_GAMMA));
        let rng = SampleRng::from_seed(seed);
        let mut request = Request::new(id, id, request, rng);
        request.options = options;
        self.scheduler.add(request);
        Ok(id)
    }

    /// Ends a request now; its blocks return to the pool. None if it is not in the engine.
    pub fn abort(&mut self, id: RequestId) -> Option<FinalRecord> {
        let request = self.scheduler.remove(id)?;
        Some(self.record(request, FinishReason::Abort))
    }

    pub fn has_unfinished(&self) -> bool {
        self.scheduler.has_work()
    }

    pub fn stats(&self) -> EngineStats {
        let prefix = self.scheduler.kv.prefix_cache_stats();
        EngineStats {
            running: self.scheduler.num_running(),
            waiting: self.scheduler.num_waiting(),
            kv_used_blocks: self.scheduler.kv.num_used_blocks(),
            kv_cache_allocated: !self.kv_released,
            prefix_query_tokens: prefix.queries,
            prefix_hit_tokens: prefix.hits,
            ..self.stats.clone()
        }
    }

    /// The KV bookkeeping, for invariant checks in tests.
    pub fn kv_manager(&self) -> &KvCacheManager {
        &self.scheduler.kv
    }

    fn record(&self, request: Request, finish_reason: FinishReason) -> FinalRecord {
        FinalRecord {
            id: request.id,
            usage: Usage {
                prompt_tokens: request.prompt_len,
                completion_tokens: request.num_tokens() - request.prompt_len,
                cached_tokens: request.num_cached_tokens.unwrap_or(0),
            },
            output_tokens: request.output().to_vec(),
            prompt_tokens: request.tokens[..request.prompt_len].to_vec(),
            logprobs: request.logprobs,
            top_logprobs: request.top_logprobs,
            finish_reason,
            num_preemptions: request.num_preemptions,
            weight_version: self.stats.weight_version,
        }
    }

    /// Runs one step: plans it, computes every scheduled token, samples for every request that
    /// caught up, and returns the tokens and the finished requests.
    /// Frees the KV cache's memory (the RL loop does, while its trainer runs on the same
    /// device). Refused with requests in flight. The prefix cache is emptied; the next step
    /// with work (or [`Engine::restore_kv_cache`]) allocates the cache again. Returns the number
    /// of K and V elements freed.
    pub fn release_kv_cache(&mut self) -> Result<usize> {
        ensure!(
            !self.scheduler.has_work(),
            "the KV cache cannot be released with {} requests running and {} waiting",
            self.scheduler.num_running(),
            self.scheduler.num_waiting()
        );
        if self.kv_released {
            return Ok(0);
        }
        let elements = self
            .kv
            .layers
            .iter()
            .map(|(k, v)| {
                self.backend.shape(k).iter().product::<usize>()
                    + self.backend.shape(v).iter().product::<usize>()
            })
            .sum::<usize>();
        // Captured graphs read the cache's memory.
        self.backend.reset_graphs();
        self.kv = PagedKv {
            num_blocks: 0,
            block_size: self.config.block_size,
            layers: Vec::new(),
        };
        self.backend.release_cached_memory();
        self.scheduler.kv.reset_prefix_cache();
        self.kv_released = true;
        Ok(elements)
    }

    /// Allocates the KV cache again after [`Engine::release_kv_cache`] (no-op otherwise).
    pub fn restore_kv_cache(&mut self) -> Result<()> {
        if self.kv_released {
            self.kv = self.model.new_paged_kv(
                &self.backend,
                self.config.num_blocks,
                self.config.block_size,
            )?;
            self.kv_released = false;
        }
        Ok(())
    }

    pub fn step(&mut self) -> Result<Vec<EngineEvent>> {
        if self.kv_released && self.scheduler.has_work() {
            self.restore_kv_cache()?;
        }
        let started = Instant::now();
        let plan = self.scheduler.schedule();
        let mut events: Vec<EngineEvent> = Vec::new();
        self.stats.preemptions += plan.preempted.len() as u64;
        for (request, reason) in plan.rejected.clone() {
            events.push(EngineEvent::Finished(
                self.record(request, FinishReason::Error(reason)),
            ));
        }
        if plan.scheduled.is_empty() {
            return Ok(events);
        }
        let (tokens, positions, layout) = self.build_layout(&plan)?;
        let prompt_rows = self.prompt_rows(&plan, &layout);
        let model_started = Instant::now();
        // A graph step samples only; prompt rows (never in a pure decode step) need the eager one.
        let graph = if prompt_rows.is_empty() {
            self.graph_step(&plan, &tokens, &positions, &layout)?
        } else {
            None
        };
        let (sample_ids, samples) = match graph {
            Some(graph_samples) => graph_samples,
            None => self.eager_step(&plan, &tokens, &positions, &layout, &prompt_rows)?,
        };
        let model_seconds = model_started.elapsed().as_secs_f64();
        for s in &plan.scheduled {
            let request = self.scheduler.get_mut(s.id).expect("scheduled request");
            let prompt_len = request.prompt_len;
            if let Some(state) = request.prompt_logprobs.as_mut() {
                if !state.delivered && state.is_complete(prompt_len) {
                    state.delivered = true;
                    let logprobs = std::mem::take(&mut state.values);
                    events.push(EngineEvent::PromptLogprobs { id: s.id, logprobs });
                }
            }
        }

        // Events in the step's scheduling order, whichever path sampled.
        let mut by_id: HashMap<RequestId, Sample> = samples.into_iter().collect();
        for id in &sample_ids {
            let sampled = by_id.remove(id).expect("every sampling row sampled");
            let max_model_len = self.config.max_model_len;
            let request = self.scheduler.get_mut(*id).expect("scheduled request");
            request.tokens.push(sampled.token);
            request.logprobs.push(sampled.logprob);
            if request.params.top_logprobs > 0 {
                request.top_logprobs.push(sampled.top_logprobs.clone());
            }
            let finish = request.finish_after(sampled.token, max_model_len);
            self.stats.generated_tokens += 1;
            events.push(EngineEvent::Token(TokenEvent {
                id: *id,
                token: sampled.token,
                logprob: sampled.logprob,
                top_logprobs: sampled.top_logprobs,
                weight_version: self.stats.weight_version,
            }));
            if let Some(reason) = finish {
                let request = self.scheduler.remove(*id).expect("running request");
                events.push(EngineEvent::Finished(self.record(request, reason)));
            }
        }
        self.stats.steps += 1;
        self.stats.last_step_seconds = started.elapsed().as_secs_f64();
        self.stats.total_step_seconds += self.stats.last_step_seconds;
        self.stats.total_model_seconds += model_seconds;
        Ok(events)
    }

    /// A step in which every scheduled request adds one token and samples it on the device,
    /// replayed from the backend's captured graph (`Backend::decode_step_graph`). `None` (and
    /// no state touched) when the step does not qualify or the backend has no graph for it.
    #[allow(clippy::type_complexity)]
    fn graph_step(
        &mut self,
        plan: &StepPlan,
        tokens: &[u32],
        positions: &[u32],
        layout: &PagedLayout,
    ) -> Result<Option<(Vec<RequestId>, Vec<(RequestId, Sample)>)>> {
        // Graphs capture one rank's work; a tensor-parallel step (collectives between threads)
        // runs eagerly.
        if !self.config.cuda_graphs || self.model.tp_size() > 1 {
            return Ok(None);
        }
        let vocab = self.model.config.vocab_size;
        let mut draws = Vec::with_capacity(plan.scheduled.len());
        let mut rngs = Vec::with_capacity(plan.scheduled.len());
        for s in &plan.scheduled {
            let request = self.scheduler.get_mut(s.id).expect("scheduled request");
            let decode = s.num_new_tokens == 1 && s.num_computed_tokens + 1 == request.num_tokens();
            if !decode || !samples_on_device(&request.params, vocab) || request.masks_logits() {
                return Ok(None);
            }
            // Draw from a copy: the requests' generators move only if the graph runs.
            let mut rng = request.rng.clone();
            draws.push(draw_for(&request.params, &mut rng));
            rngs.push(rng);
        }
        let Some(sampled) = self.backend.decode_step_graph(
            &self.model,
            &mut self.kv,
            tokens,
            positions,
            layout,
            &draws,
        )?
        else {
            return Ok(None);
        };
        self.scheduler.complete(plan);
        self.stats.graph_steps += 1;
        let ids: Vec<RequestId> = plan.scheduled.iter().map(|s| s.id).collect();
        for (id, rng) in ids.iter().zip(rngs) {
            self.scheduler.get_mut(*id).expect("scheduled request").rng = rng;
        }
        let samples = ids
            .iter()
            .zip(sampled)
            .map(|(&id, (token, logprob))| {
                let top_logprobs = Vec::new();
                (
                    id,
                    Sample {
                        token,
                        logprob,
                        top_logprobs,
                    },
                )
            })
            .collect();
        Ok(Some((ids, samples)))
    }

    /// The step run op by op: forward over the paged cache, then the LM head of the rows that
    /// sample, sampled on the device where the request allows it and on the host otherwise.
    #[allow(clippy::type_complexity)]
    fn eager_step(
        &mut self,
        plan: &StepPlan,
        tokens: &[u32],
        positions: &[u32],
        layout: &PagedLayout,
        prompt_rows: &[PromptRow],
    ) -> Result<(Vec<RequestId>, Vec<(RequestId, Sample)>)> {
        let hidden =
            self.model
                .forward_paged(&self.backend, tokens, positions, layout, &mut self.kv)?;
        self.scheduler.complete(plan);
        self.record_prompt_logprobs(&hidden, prompt_rows)?;
        let (sample_rows, sample_ids) = self.rows_that_sample(plan, layout);
        if sample_rows.is_empty() {
            // Nothing sampled: wait for the device so the step's time split stays honest.
            self.backend
                .to_host(&self.backend.slice_rows(&hidden, 0..1)?)?;
            return Ok((sample_ids, Vec::new()));
        }
        let samples = self.sample_rows(&hidden, &sample_rows, &sample_ids)?;
        Ok((sample_ids, samples))
    }

    /// Scores the step's prompt rows (see [`Self::prompt_rows`]) into their requests' prompt
    /// logprobs.
    fn record_prompt_logprobs(
        &mut self,
        hidden: &B::Tensor,
        prompt_rows: &[PromptRow],
    ) -> Result<()> {
        let scored = score_rows(&self.backend, &self.model, hidden, prompt_rows)?;
        for (row, scored) in prompt_rows.iter().zip(scored) {
            let request = self.scheduler.get_mut(row.id).expect("scheduled request");
            let state = request.prompt_logprobs.as_mut().expect("asked for");
            state.values.push(scored);
        }
        Ok(())
    }

    /// Requests that caught up sample from their last row: those rows and requests, in step
    /// order.
    fn rows_that_sample(
        &mut self,
        plan: &StepPlan,
        layout: &PagedLayout,
    ) -> (Vec<u32>, Vec<RequestId>) {
        let mut sample_rows = Vec::new();
        let mut sample_ids = Vec::new();
        for (s, scheduled) in plan.scheduled.iter().enumerate() {
            let caught_up = self
                .scheduler
                .get_mut(scheduled.id)
                .is_some_and(|r| r.num_uncomputed() == 0);
            if caught_up {
                sample_rows.push(layout.cu_query[s + 1] - 1);
                sample_ids.push(scheduled.id);
            }
        }
        (sample_rows, sample_ids)
    }

    /// The LM head over the sampling rows and a token for each. Rows the device samples (no
    /// filters, no top logprobs: the RL setting) go first, the rest after them, so the host
    /// copies only the logits it needs. Samples in that order: device rows, then host rows.
    fn sample_rows(
        &mut self,
        hidden: &B::Tensor,
        sample_rows: &[u32],
        sample_ids: &[RequestId],
    ) -> Result<Vec<(RequestId, Sample)>> {
        let vocab = self.model.config.vocab_size;
        let (device_ids, host_ids): (Vec<RequestId>, Vec<RequestId>) =
            sample_ids.iter().partition(|&&id| {
                let request = self.scheduler.get_mut(id).expect("scheduled request");
                samples_on_device(&request.params, vocab) && !request.masks_logits()
            });
        let row_of: HashMap<RequestId, u32> = sample_ids
            .iter()
            .copied()
            .zip(sample_rows.iter().copied())
            .collect();
        let ordered_rows: Vec<u32> = device_ids
            .iter()
            .chain(&host_ids)
            .map(|id| row_of[id])
            .collect();
        let rows = self.backend.gather_rows(hidden, &ordered_rows)?;
        let logits = self.model.lm_head(&self.backend, &rows)?;
        let mut samples: Vec<(RequestId, Sample)> = Vec::with_capacity(sample_ids.len());
        if !device_ids.is_empty() {
            let device_logits = if host_ids.is_empty() {
                None
            } else {
                Some(self.backend.slice_rows(&logits, 0..device_ids.len())?)
            };
            let logits = device_logits.as_ref().unwrap_or(&logits);
            samples.extend(self.sample_on_device(logits, &device_ids)?);
        }
        if !host_ids.is_empty() {
            let mut host_logits = if device_ids.is_empty() {
                self.backend.to_host(&logits)?
            } else {
                let rows = self
                    .backend
                    .slice_rows(&logits, device_ids.len()..ordered_rows.len())?;
                self.backend.to_host(&rows)?
            };
            for (id, row) in host_ids.iter().zip(host_logits.chunks_exact_mut(vocab)) {
                let request = self.scheduler.get_mut(*id).expect("scheduled request");
                request.mask_logits(row);
                samples.push((*id, sample(row, &request.params, &mut request.rng)));
            }
        }
        Ok(samples)
    }

    /// Samples `logits` (one row per request of `ids`) on the device, each row with a draw from
    /// its request's generator.
    fn sample_on_device(
        &mut self,
        logits: &B::Tensor,
        ids: &[RequestId],
    ) -> Result<Vec<(RequestId, Sample)>> {
        let draws: Vec<RowDraw> = ids
            .iter()
            .map(|id| {
                let request = self.scheduler.get_mut(*id).expect("scheduled request");
                draw_for(&request.params, &mut request.rng)
            })
            .collect();
        let sampled = self.backend.sample_rows(logits, &draws)?;
        Ok(ids
            .iter()
            .zip(sampled)
            .map(|(&id, (token, logprob))| {
                let top_logprobs = Vec::new();
                let sample = Sample {
                    token,
                    logprob,
                    top_logprobs,
                };
                (id, sample)
            })
            .collect())
    }

    /// The rows of a planned step that score prompt tokens whose logprobs are asked for and
    /// still missing, in step order (see [`crate::engine::prompt_logprobs`]).
    fn prompt_rows(&mut self, plan: &StepPlan, layout: &PagedLayout) -> Vec<PromptRow> {
        let mut rows = Vec::new();
        for (i, s) in plan.scheduled.iter().enumerate() {
            let request = self.scheduler.get_mut(s.id).expect("scheduled request");
            let Some(state) = &request.prompt_logprobs else {
                continue;
            };
            let computed = s.num_computed_tokens..s.num_computed_tokens + s.num_new_tokens;
            for p in state.rows_needed(request.prompt_len, computed) {
                rows.push(PromptRow {
                    id: s.id,
                    row: layout.cu_query[i] + (p - s.num_computed_tokens) as u32,
                    target: request.tokens[p + 1],
                    top_n: state.top_n,
                });
            }
        }
        rows
    }

    /// Token ids, positions and the paged layout of a planned step.
    fn build_layout(&mut self, plan: &StepPlan) -> Result<(Vec<u32>, Vec<u32>, PagedLayout)> {
        let bs = self.config.block_size;
        let max_blocks = plan
            .scheduled
            .iter()
            .map(|s| (s.num_computed_tokens + s.num_new_tokens).div_ceil(bs))
            .max()
            .unwrap_or(0);
        let mut layout = PagedLayout {
            block_size: bs,
            cu_query: vec![0],
            max_blocks_per_seq: max_blocks,
            ..Default::default()
        };
        let (mut tokens, mut positions) = (Vec::new(), Vec::new());
        for s in &plan.scheduled {
            let request = self.scheduler.get_mut(s.id).expect("scheduled request");
            let end = s.num_computed_tokens + s.num_new_tokens;
            tokens.extend_from_slice(&request.tokens[s.num_computed_tokens..end]);
            positions.extend(s.num_computed_tokens as u32..end as u32);
            let table = self.scheduler.kv.block_table(s.id);
            ensure!(
                table.len() * bs >= end,
                "request {}: {} blocks for {end} tokens",
                s.id,
                table.len()
            );
            for p in s.num_computed_tokens..end {
                layout
                    .slot_mapping
                    .push(table[p / bs] * bs as u32 + (p % bs) as u32);
            }
            let used = end.div_ceil(bs);
            layout.block_tables.extend_from_slice(&table[..used]);
            layout
                .block_tables
                .extend(std::iter::repeat_n(0, max_blocks - used));
            layout.context_lens.push(end as u32);
            layout.cu_query.push(tokens.len() as u32);
        }
        Ok((tokens, positions, layout))
    }
}

/// True when a request's sampling is what `Backend::sample_rows` does: greedy, or no filter
/// (top_k off or at least the vocabulary, top_p 1, min_p 0), and no top logprobs. The rest need
/// a sort and go to the host sampler.
fn samples_on_device(params: &SamplingParams, vocab: usize) -> bool {
    let greedy = params.is_greedy();
    let unfiltered =
        params.top_k.is_none_or(|k| k >= vocab) && params.top_p >= 1.0 && params.min_p <= 0.0;
    params.top_logprobs == 0 && (greedy || unfiltered)
}

/// The device draw of one sample: the temperature and, unless greedy, the request's one uniform
/// draw (the host sampler's contract: exactly one draw per sample, none when greedy).
fn draw_for(params: &SamplingParams, rng: &mut SampleRng) -> RowDraw {
    let greedy = params.is_greedy();
    RowDraw {
        temperature: if greedy { 0.0 } else { params.temperature },
        uniform: if greedy { 0.0 } else { rng.next_f64() },
    }
}
