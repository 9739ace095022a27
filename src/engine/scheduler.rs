//! Continuous batching by one rule (DESIGN.md decision 7): each step, every running request's
//! `num_computed_tokens` catches up to its `num_tokens` as far as a per-step token budget allows.
//! There is no prefill or decode phase: a long prompt is prefilled in chunks alongside ongoing
//! decodes, and a prefix-cache hit simply starts a request with tokens already computed.
//!
//! ```text
//!  step:  budget = max_num_batched_tokens
//!   1. running, in admission order: n = min(uncomputed, budget); allocate slots for n tokens;
//!      no room -> preempt the last in (priority, arrival) order among the running requests
//!      not yet scheduled this step (free its blocks, computed := 0, back to the queue) and retry
//!   2. if nobody was preempted: admit waiting requests in (priority, arrival) order while
//!      budget and seats remain: prefix-cache lookup, then the same allocation; no room -> stop
//! ```
//!
//! Priorities follow vLLM's priority policy: a lower `priority` runs first, equal priorities in
//! arrival order, so with every priority 0 (the default) this is first come, first served. The
//! waiting queue is kept sorted by (priority, arrival). A prefix-cache lookup uses the request's
//! cache salt: blocks are shared only between requests with the same salt.
//!
//! Requests scheduled in a step are never freed before that step runs (the KV cache's contract);
//! aborts arrive between steps.

use crate::engine::request::Request;
use crate::kvcache::{KvCacheError, KvCacheManager, RequestId};
use std::collections::VecDeque;

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Most requests running at once.
    pub max_num_seqs: usize,
    /// Token budget of one step (prefill chunks plus decodes).
    pub max_num_batched_tokens: usize,
    /// Longest sequence (prompt + output).
    pub max_model_len: usize,
}

/// One request's share of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledRequest {
    pub id: RequestId,
    /// Tokens already in the cache before this step.
    pub num_computed_tokens: usize,
    /// Tokens computed this step (positions `num_computed_tokens ..`).
    pub num_new_tokens: usize,
}

#[derive(Clone, Debug, Default)]
pub struct StepPlan {
    pub scheduled: Vec<ScheduledRequest>,
    /// Requests preempted while planning (they recompute later).
    pub preempted: Vec<RequestId>,
    /// Requests that can never run (longer than the whole cache), with the reason.
    pub rejected: Vec<(Request, String)>,
}

impl StepPlan {
    pub fn num_tokens(&self) -> usize {
        self.scheduled.iter().map(|s| s.num_new_tokens).sum()
    }
}

pub struct Scheduler {
    pub config: SchedulerConfig,
    pub kv: KvCacheManager,
    waiting: VecDeque<Request>,
    /// Admission order (oldest first).
    running: Vec<Request>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, kv: KvCacheManager) -> Self {
        Self {
            config,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    pub fn add(&mut self, request: Request) {
        self.enqueue(request);
    }

    /// Inserts into the waiting queue in (priority, arrival) order, after equal keys.
    fn enqueue(&mut self, request: Request) {
        let key = queue_key(&request);
        let at = self.waiting.partition_point(|r| queue_key(r) <= key);
        self.waiting.insert(at, request);
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub fn get_mut(&mut self, id: RequestId) -> Option<&mut Request> {
        self.running
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .find(|r| r.id == id)
    }

    /// Removes a request wherever it is and returns its blocks to the pool.
    pub fn remove(&mut self, id: RequestId) -> Option<Request> {
        let request = if let Some(i) = self.running.iter().position(|r| r.id == id) {
            Some(self.running.remove(i))
        } else if let Some(i) = self.waiting.iter().position(|r| r.id == id) {
            self.waiting.remove(i)
        } else {
            None
        };
        self.kv.free(id);
        request
    }

    /// Plans one step. The caller runs it, then reports with [`Scheduler::complete`].
    pub fn schedule(&mut self) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.config.max_num_batched_tokens;

        // 1. Running requests, oldest first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let n = self.running[i].num_uncomputed().min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            match self.allocate(i, n, &[]) {
                Ok(true) => {
                    plan.scheduled.push(ScheduledRequest {
                        id: self.running[i].id,
                        num_computed_tokens: self.running[i].num_computed_tokens,
                        num_new_tokens: n,
                    });
                    budget -= n;
                    i += 1;
                }
                Ok(false) => {
                    // The last in (priority, arrival) order not yet scheduled this step makes
                    // room (possibly this one, when it is the last left).
                    let victim = (i..self.running.len())
                        .max_by_key(|&k| queue_key(&self.running[k]))
                        .expect("request i is running");
                    let preempted = self.preempt(victim);
                    plan.preempted.push(preempted);
                    if victim == i {
                        break;
                    }
                }
                Err(e) => {
                    let request = self.running.remove(i);
                    self.kv.free(request.id);
                    plan.rejected.push((request, e.to_string()));
                }
            }
        }

        // 2. Admission, FIFO, only when nothing had to be preempted.
        while plan.preempted.is_empty()
            && budget > 0
            && self.running.len() < self.config.max_num_seqs
        {
            let Some(mut request) = self.waiting.pop_front() else {
                break;
            };
            let (hits, hit_tokens) = if request.num_computed_tokens > 0 {
                (Vec::new(), request.num_computed_tokens)
            } else if request.needs_prompt_rows() {
                // Its prompt logprobs need every prompt row computed.
                (Vec::new(), 0)
            } else {
                self.kv
                    .get_computed_blocks_salted(&request.tokens, request.options.cache_salt)
            };
            let n = (request.num_tokens() - hit_tokens).min(budget);
            let salt = request.options.cache_salt;
            match self.kv.allocate_slots_salted(
                request.id,
                &request.tokens,
                hit_tokens,
                n,
                &hits,
                salt,
            ) {
                Ok(Some(_)) => {
                    request.num_computed_tokens = hit_tokens;
                    request.num_cached_tokens.get_or_insert(hit_tokens);
                    plan.scheduled.push(ScheduledRequest {
                        id: request.id,
                        num_computed_tokens: hit_tokens,
                        num_new_tokens: n,
                    });
                    budget -= n;
                    self.running.push(request);
                }
                Ok(None) => {
                    self.enqueue(request);
                    break;
                }
                Err(e) => {
                    self.kv.free(request.id);
                    plan.rejected.push((request, e.to_string()));
                }
            }
        }
        plan
    }

    /// Allocates `n` more tokens for running request `i`: Ok(false) when the pool is full.
    fn allocate(&mut self, i: usize, n: usize, hits: &[u32]) -> Result<bool, KvCacheError> {
        let r = &self.running[i];
        let salt = r.options.cache_salt;
        self.kv
            .allocate_slots_salted(r.id, &r.tokens, r.num_computed_tokens, n, hits, salt)
            .map(|allocated| allocated.is_some())
    }

    fn preempt(&mut self, index: usize) -> RequestId {
        let mut request = self.running.remove(index);
        self.kv.free(request.id);
        request.num_computed_tokens = 0;
        request.num_preemptions += 1;
        let id = request.id;
        self.enqueue(request);
        id
    }

    /// After a step ran: every scheduled request has its new tokens computed.
    pub fn complete(&mut self, plan: &StepPlan) {
        for s in &plan.scheduled {
            if let Some(r) = self.running.iter_mut().find(|r| r.id == s.id) {
                r.num_computed_tokens = s.num_computed_tokens + s.num_new_tokens;
            }
        }
    }

    /// Running requests in admission order.
    pub fn running(&self) -> &[Request] {
        &self.running
    }
}

/// The order requests wait and run in: priority (lower first), then arrival.
fn queue_key(request: &Request) -> (i64, u64) {
    (request.options.priority, request.arrival)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::request::GenerationRequest;
    use crate::engine::sampler::{SampleRng, SamplingParams};

    fn request(id: u64, prompt_len: usize) -> Request {
        Request::new(
            id,
            id,
            GenerationRequest {
                prompt: (0..prompt_len as u32)
                    .map(|t| t + 100 * id as u32)
                    .collect(),
                params: SamplingParams::greedy(),
                max_tokens: 4,
                stop_ids: vec![],
                prompt_logprobs: None,
            },
            SampleRng::from_seed(id),
        )
    }

    fn scheduler(num_blocks: usize, budget: usize) -> Scheduler {
        Scheduler::new(
            SchedulerConfig {
                max_num_seqs: 8,
                max_num_batched_tokens: budget,
                max_model_len: 1024,
            },
            KvCacheManager::new(num_blocks, 4, true).unwrap(),
        )
    }

    #[test]
    fn long_prompts_are_chunked_beside_decodes() {
        let mut s = scheduler(64, 10);
        s.add(request(1, 3));
        let plan = s.schedule();
        assert_eq!(plan.num_tokens(), 3);
        s.complete(&plan);
        s.get_mut(1).unwrap().tokens.push(7); // sampled
        s.add(request(2, 25));
        let plan = s.schedule();
        // The decode goes first, the new prompt gets the rest of the budget.
        assert_eq!(plan.scheduled[0].num_new_tokens, 1);
        assert_eq!(plan.scheduled[1].num_new_tokens, 9);
        s.complete(&plan);
        s.get_mut(1).unwrap().tokens.push(8); // sampled again
        let plan = s.schedule();
        assert_eq!(plan.scheduled.len(), 2);
        assert_eq!(plan.scheduled[1].num_computed_tokens, 9);
        assert_eq!(plan.scheduled[1].num_new_tokens, 9);
    }

    #[test]
    fn full_pool_preempts_the_youngest_and_frees_its_blocks() {
        // 6 usable blocks of 4 tokens.
        let mut s = scheduler(7, 64);
        s.add(request(1, 8));
        s.add(request(2, 12));
        let plan = s.schedule();
        assert_eq!(plan.scheduled.len(), 2);
        s.complete(&plan);
        for id in [1, 2] {
            let r = s.get_mut(id).unwrap();
            r.tokens.extend([1, 2, 3, 4, 5]); // pretend several samples: both need more blocks
        }
        let plan = s.schedule();
        assert_eq!(plan.preempted, vec![2]);
        assert_eq!(plan.scheduled.len(), 1);
        assert_eq!(s.num_waiting(), 1);
        s.complete(&plan);
        s.remove(1);
        s.remove(2);
        assert_eq!(s.kv.num_used_blocks(), 0);
        s.kv.check_invariants().unwrap();
    }

    #[test]
    fn shared_prompts_hit_the_prefix_cache_in_the_same_step() {
        let mut s = scheduler(64, 256);
        for id in 1..=3 {
            let mut r = request(1, 17);
            r.id = id;
            s.add(r);
        }
        let plan = s.schedule();
        let computed: Vec<usize> = plan
            .scheduled
            .iter()
            .map(|p| p.num_computed_tokens)
            .collect();
        assert_eq!(computed, vec![0, 16, 16]);
        assert_eq!(s.kv.prefix_cache_stats().hits, 32);
    }

    #[test]
    fn lower_priority_values_are_admitted_first_and_preempted_last() {
        // One seat: the queue decides who runs.
        let mut s = scheduler(64, 256);
        s.config.max_num_seqs = 1;
        for (id, priority) in [(1, 0), (2, 5), (3, -1), (4, 0)] {
            let mut r = request(id, 3);
            r.options.priority = priority;
            s.add(r);
        }
        let mut order = Vec::new();
        while s.has_work() {
            let plan = s.schedule();
            let id = plan.scheduled[0].id;
            order.push(id);
            s.complete(&plan);
            s.remove(id);
        }
        assert_eq!(order, vec![3, 1, 4, 2]);
        // A full pool preempts the last in (priority, arrival) order, not the youngest.
        let mut s = scheduler(7, 64);
        let mut low = request(1, 8);
        low.options.priority = 9;
        s.add(low);
        s.add(request(2, 12));
        let plan = s.schedule();
        assert_eq!(plan.scheduled.len(), 2);
        s.complete(&plan);
        for id in [1, 2] {
            s.get_mut(id).unwrap().tokens.extend([1, 2, 3, 4, 5]);
        }
        let plan = s.schedule();
        assert_eq!(plan.preempted, vec![1]);
    }

    #[test]
    fn a_cache_salt_isolates_prefix_cache_entries() {
        let mut s = scheduler(64, 256);
        let salted = |id: u64, salt: Option<u64>| {
            let mut r = request(1, 17);
            r.id = id;
            r.arrival = id;
            r.options.cache_salt = salt;
            r
        };
        s.add(salted(1, Some(7)));
        s.add(salted(2, Some(7)));
        s.add(salted(3, Some(8)));
        s.add(salted(4, None));
        let plan = s.schedule();
        let computed: Vec<usize> = plan
            .scheduled
            .iter()
            .map(|p| p.num_computed_tokens)
            .collect();
        assert_eq!(computed, vec![0, 16, 0, 0]);
    }

    #[test]
    fn a_prompt_larger_than_the_cache_is_rejected_not_looped() {
        let mut s = scheduler(3, 64);
        s.add(request(1, 40));
        let plan = s.schedule();
        assert_eq!(plan.rejected.len(), 1);
        assert!(!s.has_work());
    }
}
