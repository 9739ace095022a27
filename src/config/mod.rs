//! HF `config.json` for `Qwen2ForCausalLM` -> [`ModelConfig`].
//!
//! Real Qwen2.5 checkpoints are written by transformers 4 (`rope_theta` at the top level,
//! `rope_scaling: {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}`);
//! transformers 5 writes `rope_parameters: {"rope_type": ..., "rope_theta": ..., ...}`. Both are
//! read. Every field is checked and a bad one is reported by name, with the file it came from.
//!
//! YaRN follows transformers' `_compute_yarn_parameters` (and vLLM): the `factor` given is used
//! as is, also when `max_position_embeddings` equals `original_max_position_embeddings` (as in
//! Qwen's own long-context instructions); the attention factor defaults to `0.1 ln(factor) + 1`.

mod shard;

pub use shard::LocalSizes;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{Map, Value};
use std::path::Path;

/// The architecture of a Qwen2 checkpoint, with every derived size the model code needs.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// Rows of the embedding matrix (padded past the tokenizer's vocabulary in real checkpoints).
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    pub rope: RopeConfig,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    pub scaling: RopeScaling,
}

#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    Yarn(YarnConfig),
}

#[derive(Clone, Debug, PartialEq)]
pub struct YarnConfig {
    pub factor: f64,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// Multiplies cos and sin (so q.k scales by its square).
    pub attention_factor: f64,
    pub truncate: bool,
}

impl ModelConfig {
    /// Reads and validates `DIR/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        Self::from_file(&dir.join("config.json"))
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read model config {}", path.display()))?;
        Self::from_json_str(&text)
            .with_context(|| format!("invalid model config {}", path.display()))
    }

    pub fn from_json_str(text: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text).context("not valid JSON")?;
        let obj = value
            .as_object()
            .ok_or_else(|| anyhow!("the top level must be a JSON object"))?;
        let config = Self::from_json(obj)?;
        config.validate()?;
        Ok(config)
    }

    fn from_json(obj: &Map<String, Value>) -> Result<Self> {
        match obj.get("architectures") {
            Some(Value::Array(archs)) => {
                if !archs.iter().any(|a| a.as_str() == Some("Qwen2ForCausalLM")) {
                    bail!("unknown architecture {}: swerve runs Qwen2ForCausalLM", Value::Array(archs.clone()));
                }
            }
            Some(other) => bail!("field `architectures` must be a list of names, found {other}"),
            None => match obj.get("model_type").and_then(Value::as_str) {
                Some("qwen2") => {}
                Some(other) => bail!("unknown model_type {other:?} and no `architectures`: swerve runs Qwen2ForCausalLM"),
                None => bail!("neither `architectures` nor `model_type` is given: cannot tell the architecture"),
            },
        }
        if let Some(act) = obj.get("hidden_act") {
            if act.as_str() != Some("silu") {
                bail!("field `hidden_act` is {act}: Qwen2 uses \"silu\"");
            }
        }
        if obj.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
            bail!("field `use_sliding_window` is true: sliding-window attention is not supported");
        }

        let hidden_size = usize_field(obj, "hidden_size")?;
        let num_attention_heads = usize_field(obj, "num_attention_heads")?;
        let num_key_value_heads = match obj.get("num_key_value_heads") {
            None | Some(Value::Null) => num_attention_heads,
            Some(_) => usize_field(obj, "num_key_value_heads")?,
        };
        if num_attention_heads == 0 || hidden_size % num_attention_heads != 0 {
            bail!("num_attention_heads ({num_attention_heads}) does not divide hidden_size ({hidden_size})");
        }
        let head_dim = match obj.get("head_dim") {
            None | Some(Value::Null) => hidden_size / num_attention_heads,
            Some(_) => usize_field(obj, "head_dim")?,
        };
        let max_position_embeddings = usize_field(obj, "max_position_embeddings")?;
        let rope = parse_rope(obj, max_position_embeddings)?;
        Ok(Self {
            hidden_size,
            intermediate_size: usize_field(obj, "intermediate_size")?,
            num_hidden_layers: usize_field(obj, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size: usize_field(obj, "vocab_size")?,
            max_position_embeddings,
            rms_norm_eps: match obj.get("rms_norm_eps") {
                None => 1e-6,
                Some(_) => f64_field(obj, "rms_norm_eps")?,
            },
            tie_word_embeddings: match obj.get("tie_word_embeddings") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => {
                    bail!("field `tie_word_embeddings` must be true or false, found {other}")
                }
            },
            rope,
        })
    }

    /// Checks the relations between fields. Called by every constructor that reads a file.
    pub fn validate(&self) -> Result<()> {
        for (name, value) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if value == 0 {
                bail!("field `{name}` must be positive");
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            bail!(
                "num_attention_heads ({}) does not divide hidden_size ({})",
                self.num_attention_heads,
                self.hidden_size
            );
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            bail!(
                "num_key_value_heads ({}) does not divide num_attention_heads ({})",
                self.num_key_value_heads,
                self.num_attention_heads
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            bail!(
                "head_dim ({}) must be even for rotary embeddings",
                self.head_dim
            );
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps.is_finite()) {
            bail!(
                "field `rms_norm_eps` must be a positive number, found {}",
                self.rms_norm_eps
            );
        }
        if !(self.rope.theta > 1.0 && self.rope.theta.is_finite()) {
            bail!(
                "rope_theta must be a number above 1, found {}",
                self.rope.theta
            );
        }
        if let RopeScaling::Yarn(yarn) = &self.rope.scaling {
            if !(yarn.factor >= 1.0 && yarn.factor.is_finite()) {
                bail!("yarn `factor` must be at least 1, found {}", yarn.factor);
            }
            if yarn.original_max_position_embeddings == 0 {
                bail!("yarn `original_max_position_embeddings` must be positive");
            }
        }
        // Token ids and positions are u32 throughout the engine and the kernels.
        if self.vocab_size as u64 > 1 << 32 {
            bail!(
                "field `vocab_size` is {}: token ids are 32-bit, so at most 2^32",
                self.vocab_size
            );
        }
        if self.max_context() as u64 > u32::MAX as u64 {
            bail!(
                "the context of {} positions (`max_position_embeddings` {}, or YaRN's \
                 `original_max_position_embeddings` x `factor`) exceeds the 32-bit positions \
                 the engine uses",
                self.max_context(),
                self.max_position_embeddings
            );
        }
        self.parameter_count()?;
        Ok(())
    }

    /// The size fields, for messages: `hidden_size 3584, intermediate_size 18944, ...`.
    fn size_fields(&self) -> String {
        format!(
            "hidden_size {}, intermediate_size {}, num_hidden_layers {}, num_attention_heads {}, \
             num_key_value_heads {}, head_dim {}, vocab_size {}",
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.vocab_size
        )
    }

    /// The parameters of the whole model (all ranks) by part, counted with overflow checks: an
    /// absurd config is an error naming its sizes, never a wrapped count.
    pub fn parameter_count(&self) -> Result<ParameterCount> {
        let overflow = |part: &str| {
            anyhow!(
                "the parameter count of {part} overflows 64 bits: {}",
                self.size_fields()
            )
        };
        let mul =
            |a: u64, b: usize, part: &str| a.checked_mul(b as u64).ok_or_else(|| overflow(part));
        let add = |a: u64, b: u64, part: &str| a.checked_add(b).ok_or_else(|| overflow(part));
        let layer = "one layer (hidden_size, intermediate_size, heads x head_dim)";
        let d = self.hidden_size as u64;
        let q = mul(self.num_attention_heads as u64, self.head_dim, layer)?;
        let kv = mul(self.num_key_value_heads as u64, self.head_dim, layer)?;
        // q_proj and o_proj: d x q each, plus q's bias; k_proj and v_proj: d x kv plus bias.
        let attention = add(mul(mul(q, 2, layer)?, self.hidden_size, layer)?, q, layer)?;
        let attention = add(
            attention,
            mul(add(mul(kv, self.hidden_size, layer)?, kv, layer)?, 2, layer)?,
            layer,
        )?;
        // gate, up and down: d x intermediate each; two norm weights.
        let mlp = mul(mul(d, self.intermediate_size, layer)?, 3, layer)?;
        let per_layer = add(add(attention, mlp, layer)?, mul(d, 2, layer)?, layer)?;
        let layers = mul(
            per_layer,
            self.num_hidden_layers,
            "the layers (num_hidden_layers x one layer)",
        )?;
        let tables = if self.tie_word_embeddings { 1 } else { 2 };
        let embeddings = mul(
            mul(
                d,
                self.vocab_size,
                "the embedding (vocab_size x hidden_size)",
            )?,
            tables,
            "the embedding and the LM head",
        )?;
        let total = add(add(layers, embeddings, "the model")?, d, "the model")?;
        Ok(ParameterCount {
            embeddings,
            per_layer,
            layers,
            total,
        })
    }

    /// Fails, naming the sizes at fault, unless the parameters at `bytes_per_parameter` bytes each
    /// fit in the `available` bytes of `memory` (e.g. "available host memory"). Called before
    /// anything is allocated from the config.
    pub fn check_parameters_fit(
        &self,
        bytes_per_parameter: usize,
        available: usize,
        memory: &str,
    ) -> Result<()> {
        let count = self.parameter_count()?;
        let bytes = count.total.checked_mul(bytes_per_parameter as u64);
        if bytes.is_some_and(|b| b <= available as u64) {
            return Ok(());
        }
        let need = bytes.map_or_else(|| "more than 2^64 bytes".to_string(), format_bytes);
        let embedding = if self.tie_word_embeddings {
            "the embedding"
        } else {
            "the embedding and the LM head"
        };
        bail!(
            "the model's parameters need {need} ({} parameters x {bytes_per_parameter} bytes: \
             `num_hidden_layers` {} x {} per layer (`hidden_size` {}, `intermediate_size` {}, \
             `num_attention_heads` {} and `num_key_value_heads` {} of `head_dim` {}), and {} in \
             {embedding} (`vocab_size` {} x `hidden_size` {})), but {memory} is {}",
            count.total,
            self.num_hidden_layers,
            count.per_layer,
            self.hidden_size,
            self.intermediate_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            count.embeddings,
            self.vocab_size,
            self.hidden_size,
            format_bytes(available as u64)
        )
    }

    /// The longest sequence the model's positions cover: `max_position_embeddings`, or with YaRN
    /// `original_max_position_embeddings * factor` when that is larger.
    pub fn max_context(&self) -> usize {
        match &self.rope.scaling {
            RopeScaling::None => self.max_position_embeddings,
            RopeScaling::Yarn(yarn) => {
                let scaled =
                    (yarn.original_max_position_embeddings as f64 * yarn.factor).floor() as usize;
                scaled.max(self.max_position_embeddings)
            }
        }
    }

    /// Parameters of the whole model (all ranks), counting the LM head once when tied
    /// (`usize::MAX` for a config whose count overflows; [`ModelConfig::validate`] refuses those).
    pub fn num_parameters(&self) -> usize {
        self.parameter_count()
            .ok()
            .and_then(|c| usize::try_from(c.total).ok())
            .unwrap_or(usize::MAX)
    }
}

/// A model's parameter count by part (see [`ModelConfig::parameter_count`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParameterCount {
    /// `vocab_size x hidden_size`, twice when the LM head is not tied.
    pub embeddings: u64,
    /// One decoder layer's parameters.
    pub per_layer: u64,
    /// `num_hidden_layers x per_layer`.
    pub layers: u64,
    /// Everything, the final norm included.
    pub total: u64,
}

/// `12.3 GiB`, `512.0 MiB`, `100 B`: a byte count for messages.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

impl RopeConfig {
    /// Inverse frequencies for the `head_dim / 2` rotated pairs, as transformers computes them
    /// (in f64 here; transformers rounds them to f32).
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f64> {
        let dim = head_dim as f64;
        let base = self.theta;
        let plain: Vec<f64> = (0..head_dim / 2)
            .map(|i| 1.0 / base.powf((2 * i) as f64 / dim))
            .collect();
        match &self.scaling {
            RopeScaling::None => plain,
            RopeScaling::Yarn(yarn) => {
                let correction_dim = |rotations: f64| {
                    dim * (yarn.original_max_position_embeddings as f64
                        / (rotations * 2.0 * std::f64::consts::PI))
                        .ln()
                        / (2.0 * base.ln())
                };
                let (mut low, mut high) = (
                    correction_dim(yarn.beta_fast),
                    correction_dim(yarn.beta_slow),
                );
                if yarn.truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let mut high = high.min(dim - 1.0);
                if low == high {
                    high += 0.001;
                }
                plain
                    .iter()
                    .enumerate()
                    .map(|(i, &extrapolation)| {
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation_weight = 1.0 - ramp;
                        let interpolation = extrapolation / yarn.factor;
                        interpolation * (1.0 - extrapolation_weight)
                            + extrapolation * extrapolation_weight
                    })
                    .collect()
            }
        }
    }

    /// The factor multiplying cos and sin (1 without YaRN).
    pub fn attention_scaling(&self) -> f64 {
        match &self.scaling {
            RopeScaling::None => 1.0,
            RopeScaling::Yarn(yarn) => yarn.attention_factor,
        }
    }
}

fn parse_rope(obj: &Map<String, Value>, max_position_embeddings: usize) -> Result<RopeConfig> {
    // transformers 5: everything in `rope_parameters`; transformers 4: `rope_theta` + `rope_scaling`.
    let (params, where_) = match (obj.get("rope_parameters"), obj.get("rope_scaling")) {
        (Some(Value::Object(p)), _) => (Some(p), "rope_parameters"),
        (Some(Value::Null) | None, Some(Value::Object(p))) => (Some(p), "rope_scaling"),
        (Some(Value::Null) | None, Some(Value::Null) | None) => (None, "rope_scaling"),
        (Some(other), _) => bail!("field `rope_parameters` must be an object, found {other}"),
        (_, Some(other)) => bail!("field `rope_scaling` must be an object or null, found {other}"),
    };
    let theta = match params.and_then(|p| p.get("rope_theta")) {
        Some(_) => {
            f64_field(params.unwrap(), "rope_theta").with_context(|| format!("in `{where_}`"))?
        }
        None => match obj.get("rope_theta") {
            Some(_) => f64_field(obj, "rope_theta")?,
            None => 10000.0,
        },
    };
    let Some(params) = params else {
        return Ok(RopeConfig {
            theta,
            scaling: RopeScaling::None,
        });
    };
    let rope_type = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .map(|v| {
            v.as_str()
                .ok_or_else(|| anyhow!("`{where_}.rope_type` must be a string, found {v}"))
        })
        .transpose()?
        .unwrap_or("default");
    let scaling = match rope_type {
        "default" => RopeScaling::None,
        "yarn" => {
            let ctx = || format!("in `{where_}`");
            let original_max_position_embeddings = match params.get("original_max_position_embeddings") {
                None | Some(Value::Null) => max_position_embeddings,
                Some(_) => usize_field(params, "original_max_position_embeddings").with_context(ctx)?,
            };
            let factor = match params.get("factor") {
                None | Some(Value::Null) => max_position_embeddings as f64 / original_max_position_embeddings as f64,
                Some(_) => f64_field(params, "factor").with_context(ctx)?,
            };
            let optional = |name: &str| -> Result<Option<f64>> {
                match params.get(name) {
                    None | Some(Value::Null) => Ok(None),
                    Some(_) => Ok(Some(f64_field(params, name).with_context(ctx)?)),
                }
            };
            let mscale_of = |scale: f64, mscale: f64| if scale <= 1.0 { 1.0 } else { 0.1 * mscale * scale.ln() + 1.0 };
            let attention_factor = match (optional("attention_factor")?, optional("mscale")?, optional("mscale_all_dim")?) {
                (Some(f), _, _) => f,
                (None, Some(m), Some(m_all)) if m != 0.0 && m_all != 0.0 => {
                    mscale_of(factor, m) / mscale_of(factor, m_all)
                }
                _ => mscale_of(factor, 1.0),
            };
            let truncate = match params.get("truncate") {
                None | Some(Value::Null) => true,
                Some(Value::Bool(b)) => *b,
                Some(other) => bail!("`{where_}.truncate` must be true or false, found {other}"),
            };
            RopeScaling::Yarn(YarnConfig {
                factor,
                original_max_position_embeddings,
                beta_fast: optional("beta_fast")?.filter(|b| *b != 0.0).unwrap_or(32.0),
                beta_slow: optional("beta_slow")?.filter(|b| *b != 0.0).unwrap_or(1.0),
                attention_factor,
                truncate,
            })
        }
        other => bail!("unsupported rope type {other:?} in `{where_}`: swerve supports \"default\" and \"yarn\""),
    };
    Ok(RopeConfig { theta, scaling })
}

fn usize_field(obj: &Map<String, Value>, name: &str) -> Result<usize> {
    let value = obj
        .get(name)
        .ok_or_else(|| anyhow!("field `{name}` is missing"))?;
    value
        .as_u64()
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| anyhow!("field `{name}` must be a non-negative integer, found {value}"))
}

fn f64_field(obj: &Map<String, Value>, name: &str) -> Result<f64> {
    let value = obj
        .get(name)
        .ok_or_else(|| anyhow!("field `{name}` is missing"))?;
    value
        .as_f64()
        .ok_or_else(|| anyhow!("field `{name}` must be a number, found {value}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN25_7B_YARN: &str = r#"{
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
        "intermediate_size": 18944, "max_position_embeddings": 32768, "max_window_layers": 28,
        "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
        "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
        "vocab_size": 152064,
        "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}
    }"#;

    #[test]
    fn reads_transformers4_qwen25_with_yarn() {
        let c = ModelConfig::from_json_str(QWEN25_7B_YARN).unwrap();
        assert_eq!(
            (c.hidden_size, c.head_dim, c.num_key_value_heads),
            (3584, 128, 4)
        );
        assert_eq!(c.rope.theta, 1e6);
        let RopeScaling::Yarn(y) = &c.rope.scaling else {
            panic!("expected yarn")
        };
        assert_eq!((y.factor, y.original_max_position_embeddings), (4.0, 32768));
        assert!((y.attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-15);
        assert_eq!(c.max_context(), 131072);
        assert!(!c.tie_word_embeddings);
        assert_eq!(c.num_parameters(), 7_615_616_512);
    }

    #[test]
    fn reads_transformers5_rope_parameters() {
        let text = QWEN25_7B_YARN.replace(r#""rope_theta": 1000000.0,"#, "").replace(
            r#""rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}"#,
            r#""rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 32768}"#,
        );
        assert!(!text.contains("rope_scaling"));
        let v5 = ModelConfig::from_json_str(&text).unwrap();
        assert_eq!(v5, ModelConfig::from_json_str(QWEN25_7B_YARN).unwrap());
        let plain = ModelConfig::from_json_str(&text.replace(
            r#""rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 32768"#,
            r#""rope_type": "default", "rope_theta": 5000.0"#,
        ))
        .unwrap();
        assert_eq!(
            plain.rope,
            RopeConfig {
                theta: 5000.0,
                scaling: RopeScaling::None
            }
        );
    }

    fn error_of(text: &str) -> String {
        format!("{:#}", ModelConfig::from_json_str(text).unwrap_err())
    }

    #[test]
    fn clear_errors() {
        let e = error_of(&QWEN25_7B_YARN.replace("Qwen2ForCausalLM", "LlamaForCausalLM"));
        assert!(
            e.contains("unknown architecture") && e.contains("LlamaForCausalLM"),
            "{e}"
        );
        let e = error_of(&QWEN25_7B_YARN.replace(
            r#""num_attention_heads": 28"#,
            r#""num_attention_heads": 27"#,
        ));
        assert!(e.contains("does not divide hidden_size"), "{e}");
        let e = error_of(
            &QWEN25_7B_YARN.replace(r#""num_key_value_heads": 4"#, r#""num_key_value_heads": 3"#),
        );
        assert!(
            e.contains("num_key_value_heads (3) does not divide num_attention_heads (28)"),
            "{e}"
        );
        let e = error_of(&QWEN25_7B_YARN.replace(r#""type": "yarn""#, r#""type": "dynamic""#));
        assert!(e.contains("unsupported rope type \"dynamic\""), "{e}");
        let e = error_of(&QWEN25_7B_YARN.replace(r#""hidden_size": 3584,"#, ""));
        assert!(e.contains("`hidden_size` is missing"), "{e}");
        let e =
            error_of(&QWEN25_7B_YARN.replace(r#""vocab_size": 152064"#, r#""vocab_size": "big""#));
        assert!(
            e.contains("`vocab_size` must be a non-negative integer"),
            "{e}"
        );
        let e = error_of("[1, 2]");
        assert!(e.contains("JSON object"), "{e}");
        let e = error_of("{\"architectures\": [");
        assert!(e.contains("not valid JSON"), "{e}");
    }

    #[test]
    fn absurd_sizes_are_refused_by_name_before_anything_is_allocated() {
        let with = |field: &str, value: &str| {
            let re = replace_field(QWEN25_7B_YARN, field, value);
            ModelConfig::from_json_str(&re)
        };
        // 10^12 layers of 7B's width: 2.3e20 parameters, past 64 bits.
        let e = format!(
            "{:#}",
            with("num_hidden_layers", "1000000000000").unwrap_err()
        );
        assert!(
            e.contains("overflows 64 bits") && e.contains("num_hidden_layers 1000000000000"),
            "{e}"
        );
        let e = format!("{:#}", with("vocab_size", "10000000000").unwrap_err());
        assert!(e.contains("`vocab_size` is 10000000000"), "{e}");
        let e = format!(
            "{:#}",
            with("max_position_embeddings", "100000000000").unwrap_err()
        );
        assert!(e.contains("`max_position_embeddings` 100000000000"), "{e}");
        // A million layers count fine (2.3e14 parameters) but fit no machine.
        let c = with("num_hidden_layers", "1000000").unwrap();
        let count = c.parameter_count().unwrap();
        assert_eq!(count.total, c.num_parameters() as u64);
        assert_eq!(count.layers, count.per_layer * 1_000_000);
        let e = format!(
            "{:#}",
            c.check_parameters_fit(4, 24 << 30, "available host memory")
                .unwrap_err()
        );
        assert!(
            e.contains("`num_hidden_layers` 1000000 x 233057792 per layer")
                && e.contains("but available host memory is 24.0 GiB"),
            "{e}"
        );
        // The real 7B fits 80 GB in bf16, not 8 GB.
        let real = ModelConfig::from_json_str(QWEN25_7B_YARN).unwrap();
        real.check_parameters_fit(2, 80 << 30, "free device memory")
            .unwrap();
        assert!(real.check_parameters_fit(2, 8 << 30, "x").is_err());
        assert_eq!(format_bytes(100), "100 B");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
    }

    /// `"field": value` of the 7B config with another value.
    fn replace_field(text: &str, field: &str, value: &str) -> String {
        let key = format!("\"{field}\": ");
        let at = text.find(&key).expect("field present") + key.len();
        let end = at + text[at..].find([',', '\n', '}']).unwrap();
        format!("{}{value}{}", &text[..at], &text[end..])
    }

    #[test]
    fn local_sizes_of_72b_tp8() {
        let text = QWEN25_7B_YARN
            .replace(r#""hidden_size": 3584"#, r#""hidden_size": 8192"#)
            .replace(
                r#""intermediate_size": 18944"#,
                r#""intermediate_size": 29568"#,
            )
            .replace(
                r#""num_attention_heads": 28"#,
                r#""num_attention_heads": 64"#,
            )
            .replace(r#""num_key_value_heads": 4"#, r#""num_key_value_heads": 8"#);
        let c = ModelConfig::from_json_str(&text).unwrap();
        for rank in 0..8 {
            let l = c.shard(8, rank).unwrap();
            assert_eq!(
                (
                    l.heads_local,
                    l.kv_heads_local,
                    l.intermediate_local,
                    l.vocab_local
                ),
                (8, 1, 3696, 19008)
            );
            assert_eq!((l.head_start, l.kv_head_start), (8 * rank, rank));
        }
        // 16 ranks over 8 KV heads: each KV head is held by two ranks, 4 query heads each.
        let l = c.shard(16, 5).unwrap();
        assert_eq!(
            (
                l.heads_local,
                l.head_start,
                l.kv_heads_local,
                l.kv_head_start
            ),
            (4, 20, 1, 2)
        );
    }
}
