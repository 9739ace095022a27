//! How one step's paged attention is cut into work items on the host (`kernels/paged_attn.cu`
//! runs them): each sequence's flat rows in tiles, each decode tile's keys in the canonical
//! segments of [`SEGMENT_KEYS`], consecutive segments of a decode tile joined into runs that one
//! block streams ([`WorkPlan::join_decode_runs`]); rows whose context spans several segments get
//! scratch rows for their partials. The cut never changes a bit: every segment is computed alone
//! from a fresh state and the merge folds the partials left to right.

use super::as_i32;
use anyhow::{ensure, Result};

/// Keys of one tile of every attention kernel (`kAttnKeyTile`); segments are multiples of it.
pub const KEY_TILE: usize = 64;
/// Keys of one canonical segment (`kernels/attn_tile.cuh`): the unit decode parallelises over
/// and every other attention path folds in the same order. A constant, never a function of the
/// batch or the GPU: changing it changes the bits of every logprob (rollouts and trainer alike).
pub const SEGMENT_KEYS: usize = 512;
/// Flat rows of a decode-kernel work item: sequences with `rows * group` up to this use it.
pub const DECODE_BLOCK_M: usize = 16;
/// Flat rows of a prefill-kernel block.
pub const PREFILL_BLOCK_M: usize = 64;
/// The most segments one decode block streams (a run): 16 x 512 keys.
pub const MAX_DECODE_RUN: usize = 16;

/// How one step's attention is cut into work items, for one `(group, kv_heads)`.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkPlan {
    /// Keys per segment ([`SEGMENT_KEYS`] unless a test forced another multiple of [`KEY_TILE`]).
    pub segment_keys: usize,
    /// `[sequence, first flat row, segment, keys]` per decode-kernel item (one warp), most keys
    /// first.
    pub decode: Vec<[i32; 4]>,
    /// The same for the prefill kernel (one block); segment -1: every key of the tile, folded in
    /// the kernel.
    pub prefill: Vec<[i32; 4]>,
    /// Per query row: `[first scratch row, segments]`; a row of one segment, or of a prefill tile
    /// folded in the kernel, has no scratch.
    pub rows: Vec<[i32; 2]>,
    /// Query rows with partials: the merge kernel's rows.
    pub split_rows: Vec<i32>,
    /// Scratch rows (one per split row and segment).
    pub scratch_rows: usize,
}

impl WorkPlan {
    /// Builds the plan. `segment_keys`: forced (tests of the merge), else [`SEGMENT_KEYS`].
    /// Prefill tiles fold their segments in the kernel unless they make fewer blocks than the
    /// GPU has SMs; then they are split per segment too.
    pub fn build(
        cu_query: &[u32],
        context_lens: &[u32],
        group: usize,
        kv_heads: usize,
        num_sms: usize,
        segment_keys: Option<usize>,
    ) -> Result<Self> {
        ensure!(
            group > 0 && cu_query.len() == context_lens.len() + 1,
            "paged attention: group {group}, {} cu_query for {} sequences",
            cu_query.len(),
            context_lens.len()
        );
        let segment_keys = segment_keys.unwrap_or(SEGMENT_KEYS);
        ensure!(
            segment_keys > 0 && segment_keys.is_multiple_of(KEY_TILE),
            "paged attention: segment of {segment_keys} keys is not a multiple of {KEY_TILE}"
        );
        // (decode?, sequence, first flat row, keys the tile sees)
        let mut tiles = Vec::new();
        let mut decode_seq = Vec::with_capacity(context_lens.len());
        for (s, (w, &context)) in cu_query.windows(2).zip(context_lens).enumerate() {
            let rows = w[1].checked_sub(w[0]).unwrap_or(u32::MAX) as usize;
            let context = context as usize;
            ensure!(
                rows <= context,
                "paged attention: sequence {s} has {rows} query rows in a context of {context}"
            );
            let (flat, first_pos) = (rows * group, context - rows);
            let decode = flat <= DECODE_BLOCK_M;
            decode_seq.push(decode);
            let block_m = if decode {
                DECODE_BLOCK_M
            } else {
                PREFILL_BLOCK_M
            };
            for m0 in (0..flat).step_by(block_m) {
                let last = (m0 + block_m).min(flat) - 1;
                tiles.push((decode, s, m0, first_pos + last / group + 1));
            }
        }
        let prefill_blocks = tiles.iter().filter(|t| !t.0).count() * kv_heads;
        let split_prefill = prefill_blocks < num_sms.max(1);
        let (mut decode, mut prefill) = (Vec::new(), Vec::new());
        for &(is_decode, s, m0, keys) in &tiles {
            if !is_decode && !split_prefill {
                prefill.push([s as i32, m0 as i32, -1, keys as i32]);
                continue;
            }
            let list = if is_decode { &mut decode } else { &mut prefill };
            for segment in 0..keys.div_ceil(segment_keys) {
                let segment_len = segment_keys.min(keys - segment * segment_keys);
                list.push([s, m0, segment, segment_len].map(|x| x as i32));
            }
        }
        // Longest first, so the long blocks do not end up in the last wave.
        decode.sort_by_key(|item| std::cmp::Reverse(item[3]));
        prefill.sort_by_key(|item| std::cmp::Reverse(item[3]));
        let (mut rows, mut split_rows, mut scratch_rows) = (Vec::new(), Vec::new(), 0usize);
        for (s, (w, &context)) in cu_query.windows(2).zip(context_lens).enumerate() {
            let n = (w[1] - w[0]) as usize;
            let split = decode_seq[s] || split_prefill;
            for local in 0..n {
                let position = context as usize - n + local;
                let parts = (position + 1).div_ceil(segment_keys);
                if split && parts > 1 {
                    split_rows.push(rows.len() as i32);
                    rows.push([scratch_rows as i32, parts as i32]);
                    scratch_rows += parts;
                } else {
                    rows.push([0, 1]);
                }
            }
        }
        as_i32("paged attention scratch rows", scratch_rows)?;
        as_i32("paged attention blocks", decode.len().max(prefill.len()))?;
        Ok(Self {
            segment_keys,
            decode,
            prefill,
            rows,
            split_rows,
            scratch_rows,
        })
    }
}

impl WorkPlan {
    /// Segments per decode run for a GPU that holds `slots` decode blocks at once (SMs x blocks
    /// per SM): the run length with the least estimated time, waves x (segments of the longest
    /// block + half a segment for a block's start: the Q load and the first tile's latency), the
    /// longer run on a tie. A lone 4k row stays one block per segment (it needs every block it
    /// can get); a lone 131k row (256 segments per kv head) becomes one wave of runs of 4 on an
    /// H100 (2 blocks per SM); 128 rows of 4k become one block per row and kv head.
    pub fn decode_run_for(&self, kv_heads: usize, slots: usize) -> usize {
        let tiles = self.decode_tile_segments();
        let longest = tiles.iter().copied().max().unwrap_or(1);
        let cost = |run: usize| {
            let blocks: usize = tiles.iter().map(|n| n.div_ceil(run)).sum::<usize>() * kv_heads;
            blocks.div_ceil(slots.max(1)) * (2 * run.min(longest) + 1)
        };
        (1..=MAX_DECODE_RUN)
            .rev()
            .min_by_key(|&run| cost(run))
            .unwrap_or(1)
    }

    /// Segments of each decode tile (sequence, first flat row).
    fn decode_tile_segments(&self) -> Vec<usize> {
        let mut tiles: std::collections::BTreeMap<(i32, i32), usize> = Default::default();
        for item in &self.decode {
            *tiles.entry((item[0], item[1])).or_default() += 1;
        }
        tiles.into_values().collect()
    }

    /// Joins each decode tile's consecutive segments into items of up to `run` segments:
    /// `[sequence, first flat row, first segment, keys of all its segments]`, most keys first.
    /// The kernel streams a run's keys through one ring and writes each segment's partial as
    /// it would have alone, so the bits never depend on `run`.
    pub fn join_decode_runs(&mut self, run: usize) {
        if run <= 1 || self.decode.is_empty() {
            return;
        }
        let mut items = std::mem::take(&mut self.decode);
        items.sort_by_key(|item| (item[0], item[1], item[2]));
        let mut joined: Vec<[i32; 4]> = Vec::with_capacity(items.len().div_ceil(run));
        let mut in_run = 0;
        for item in items {
            match joined.last_mut() {
                Some(last)
                    if in_run < run
                        && (last[0], last[1]) == (item[0], item[1])
                        && last[2] + in_run as i32 == item[2] =>
                {
                    last[3] += item[3];
                    in_run += 1;
                }
                _ => {
                    joined.push(item);
                    in_run = 1;
                }
            }
        }
        joined.sort_by_key(|item| std::cmp::Reverse(item[3]));
        self.decode = joined;
    }
}
