//! Allocator configuration: PyTorch 2.11's `PYTORCH_CUDA_ALLOC_CONF` keys, parsed from the same
//! string syntax or set through [`ConfigBuilder`] (`docs/allocator-rules.md` §19).
//!
//! ```
//! use cachalot_core::AllocatorConfig;
//! let config = AllocatorConfig::parse("max_split_size_mb:64,roundup_power2_divisions:[256:1,>:4]")?;
//! assert_eq!(config.max_split_size(), Some(64 << 20));
//! let same = AllocatorConfig::builder().max_split_size_mb(64).build()?;
//! assert_eq!(same.max_split_size(), config.max_split_size());
//! # Ok::<(), cachalot_core::ConfigError>(())
//! ```

use crate::size::{LARGE_BUFFER, MAX_REQUEST, MIB, MIN_LARGE_ALLOC, ROUNDUP_INTERVALS, RoundupDivisions};

/// Largest `large_segment_size_mb`: a segment of 1 EiB ([`MAX_REQUEST`]), the largest request
/// PyTorch serves. Larger values would wrap when multiplied to bytes (2^44 MiB is 0 bytes in
/// 64 bits), so they are refused rather than silently becoming a small segment size.
pub const MAX_LARGE_SEGMENT_SIZE_MB: u64 = MAX_REQUEST / MIB;

/// Largest value of `pinned_num_register_threads` PyTorch accepts.
const MAX_PINNED_REGISTER_THREADS: u64 = 128;

/// Which allocator PyTorch's `backend` key selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum AllocatorBackendKind {
    /// The caching allocator this crate implements.
    Native,
    /// CUDA's stream-ordered allocator, which replaces the caching allocator entirely.
    CudaMallocAsync,
}

/// Which placement policy the allocator follows (`policy:` key, cachalot's own, not PyTorch's).
///
/// PyTorch's is the default and is exact; [`Policy::Cachalot`] is an opt-in policy that
/// fragments less (`docs/allocator-rules.md` §24 and the module doc of
/// `core/src/allocator/policy/cachalot.rs` say what it changes). Each is one implementation of
/// the allocator's policy trait (`core/src/allocator/policy/`). A string that selects cachalot's
/// is no longer a valid `PYTORCH_CUDA_ALLOC_CONF`: PyTorch would reject the key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Policy {
    /// PyTorch 2.11's caching allocator, exact to the byte (`policy:pytorch`, the default).
    #[default]
    #[cfg_attr(feature = "serde", serde(rename = "pytorch"))]
    PyTorch,
    /// cachalot's low-fragmentation policy (`policy:cachalot`): 512-byte rounding, 2 MiB pages
    /// where the device maps them (segments sized to the request where it does not), and fully
    /// free cached memory returned before new memory is taken.
    Cachalot,
}

impl Policy {
    /// The value written after `policy:`.
    pub fn name(self) -> &'static str {
        match self {
            Policy::PyTorch => "pytorch",
            Policy::Cachalot => "cachalot",
        }
    }
}

/// A configuration string or builder value that PyTorch 2.11 would reject.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A key PyTorch 2.11 does not know (the same words PyTorch raises at CUDA init).
    #[error("Unrecognized key '{}' in CUDA allocator config.", crate::text::shorten(key))]
    UnknownKey {
        /// The key as written.
        key: String,
    },
    /// A key with no value after its colon.
    #[error("allocator config: key '{}' has no value", crate::text::shorten(key))]
    MissingValue {
        /// The key.
        key: String,
    },
    /// A value of the wrong form or outside the allowed range.
    #[error(
        "allocator config: invalid value '{}' for '{}': {reason}",
        crate::text::shorten(value),
        crate::text::shorten(key)
    )]
    InvalidValue {
        /// The key whose value is wrong.
        key: String,
        /// The value as written.
        value: String,
        /// What the value must be.
        reason: String,
    },
    /// A separator missing or out of place.
    #[error("allocator config: expected '{expected}' after '{}'", crate::text::shorten(after))]
    Syntax {
        /// The token that was required.
        expected: String,
        /// The last token read before the error.
        after: String,
    },
}

/// Everything PyTorch's caching allocator reads from its configuration.
///
/// Built by [`AllocatorConfig::parse`] or [`AllocatorConfig::builder`]; the default is PyTorch's
/// default (no `PYTORCH_CUDA_ALLOC_CONF`).
///
/// ```
/// use cachalot_core::AllocatorConfig;
///
/// // The string a PyTorch job sets in PYTORCH_CUDA_ALLOC_CONF, with PyTorch's own error texts.
/// let config = AllocatorConfig::parse("expandable_segments:True,max_split_size_mb:256")?;
/// assert!(config.expandable_segments());
/// assert_eq!(config.max_split_size(), Some(256 << 20));
///
/// // The same settings built in code.
/// let built = AllocatorConfig::builder().expandable_segments(true).max_split_size_mb(256).build()?;
/// assert_eq!(built.max_split_size(), config.max_split_size());
///
/// let error = AllocatorConfig::parse("max_split_size_mb:1").unwrap_err();
/// assert!(error.to_string().contains("max_split_size_mb"), "{error}");
/// # Ok::<(), cachalot_core::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AllocatorConfig {
    /// The settings string this configuration was parsed from ("" when built in code).
    pub(crate) settings: String,
    pub(crate) max_split_size: u64,
    pub(crate) max_non_split_rounding_size: u64,
    pub(crate) large_segment_size: u64,
    pub(crate) garbage_collection_threshold: f64,
    pub(crate) roundup_power2_divisions: RoundupDivisions,
    pub(crate) expandable_segments: bool,
    pub(crate) per_process_memory_fraction: f64,
    pub(crate) backend: AllocatorBackendKind,
    pub(crate) release_lock_on_cudamalloc: bool,
    pub(crate) pinned_use_cuda_host_register: bool,
    pub(crate) pinned_num_register_threads: u64,
    pub(crate) pinned_use_background_threads: bool,
    pub(crate) pinned_reserve_segment_size_mb: u64,
    pub(crate) graph_capture_record_stream_reuse: bool,
    /// cachalot's own key: which placement policy applies.
    #[cfg_attr(feature = "serde", serde(default))]
    pub(crate) policy: Policy,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            settings: String::new(),
            max_split_size: u64::MAX,
            max_non_split_rounding_size: LARGE_BUFFER,
            large_segment_size: LARGE_BUFFER,
            garbage_collection_threshold: 0.0,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            expandable_segments: false,
            per_process_memory_fraction: 1.0,
            backend: AllocatorBackendKind::Native,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            pinned_reserve_segment_size_mb: 0,
            graph_capture_record_stream_reuse: false,
            policy: Policy::PyTorch,
        }
    }
}

impl AllocatorConfig {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` string, e.g. `"expandable_segments:True"`.
    ///
    /// Every 2.11 key is accepted; an unknown key or a bad value is an error that names it.
    /// `large_segment_size_mb` is applied before the keys whose limits depend on it, as in
    /// PyTorch.
    pub fn parse(settings: &str) -> Result<Self, ConfigError> {
        let tokens = tokenize(settings);
        let mut config = AllocatorConfig { settings: settings.to_owned(), ..Self::default() };
        let entries = split_entries(&tokens)?;
        // large_segment_size_mb changes the defaults and limits of other keys: apply it first.
        for (key, value) in &entries {
            if *key == "large_segment_size_mb" {
                let mb = parse_uint(key, value)?;
                config.set_large_segment_size_mb(mb)?;
            }
        }
        for (key, value) in &entries {
            config.apply(key, value)?;
        }
        Ok(config)
    }

    /// A builder starting from PyTorch's defaults.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder { config: Ok(Self::default()) }
    }

    fn apply(&mut self, key: &str, value: &[&str]) -> Result<(), ConfigError> {
        match key {
            "large_segment_size_mb" => {} // applied first, see `parse`
            "max_split_size_mb" => self.set_max_split_size_mb(parse_uint(key, value)?)?,
            "max_non_split_rounding_mb" => self.set_max_non_split_rounding_mb(parse_uint(key, value)?)?,
            "garbage_collection_threshold" => self.set_garbage_collection_threshold(parse_float(key, value)?)?,
            "roundup_power2_divisions" => self.roundup_power2_divisions = parse_divisions(key, value)?,
            "expandable_segments" => self.expandable_segments = parse_bool(key, value)?,
            "pinned_use_background_threads" => self.pinned_use_background_threads = parse_bool(key, value)?,
            "backend" => {
                self.backend = match single(key, value)? {
                    "native" => AllocatorBackendKind::Native,
                    "cudaMallocAsync" => AllocatorBackendKind::CudaMallocAsync,
                    other => {
                        return Err(invalid(key, other, "options are native and cudaMallocAsync"));
                    }
                }
            }
            "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                self.release_lock_on_cudamalloc = parse_bool(key, value)?
            }
            "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                self.pinned_use_cuda_host_register = parse_bool(key, value)?
            }
            "pinned_num_register_threads" => {
                let threads = parse_uint(key, value)?;
                check_pinned_threads(threads)?;
                self.pinned_num_register_threads = threads;
            }
            "pinned_reserve_segment_size_mb" => {
                let mb = parse_uint(key, value)?;
                if mb == 0 {
                    return Err(invalid(key, "0", "Pinned reserve segment size has to be greater than 0"));
                }
                self.pinned_reserve_segment_size_mb = mb;
            }
            "graph_capture_record_stream_reuse" => self.graph_capture_record_stream_reuse = parse_bool(key, value)?,
            "per_process_memory_fraction" => self.set_memory_fraction(parse_float(key, value)?)?,
            // cachalot's own key, not PyTorch's (see `Policy`).
            "policy" => {
                self.policy = match single(key, value)? {
                    "pytorch" => Policy::PyTorch,
                    "cachalot" => Policy::Cachalot,
                    other => return Err(invalid(key, other, "options are pytorch and cachalot")),
                }
            }
            other => return Err(ConfigError::UnknownKey { key: other.to_owned() }),
        }
        Ok(())
    }

    fn set_large_segment_size_mb(&mut self, mb: u64) -> Result<(), ConfigError> {
        let key = "large_segment_size_mb";
        if mb > MAX_LARGE_SEGMENT_SIZE_MB {
            return Err(invalid(
                key,
                &mb.to_string(),
                &format!("must be at most {MAX_LARGE_SEGMENT_SIZE_MB} (1 EiB, the largest request PyTorch serves)"),
            ));
        }
        let bytes = mb * MIB; // cannot wrap: checked against MAX_LARGE_SEGMENT_SIZE_MB above
        if bytes <= MIN_LARGE_ALLOC {
            return Err(invalid(key, &mb.to_string(), "must be greater than 10 (kMinLargeAlloc)"));
        }
        self.large_segment_size = bytes;
        self.max_non_split_rounding_size = self.large_segment_size;
        Ok(())
    }

    fn set_max_split_size_mb(&mut self, mb: u64) -> Result<(), ConfigError> {
        let minimum = self.large_segment_size / MIB;
        if mb < minimum {
            return Err(invalid(
                "max_split_size_mb",
                &mb.to_string(),
                &format!("CachingAllocator option max_split_size_mb too small, must be >= {minimum}"),
            ));
        }
        self.max_split_size = mb.min(u64::MAX / MIB) * MIB;
        Ok(())
    }

    fn set_max_non_split_rounding_mb(&mut self, mb: u64) -> Result<(), ConfigError> {
        let minimum = LARGE_BUFFER / MIB;
        if mb < minimum {
            return Err(invalid(
                "max_non_split_rounding_mb",
                &mb.to_string(),
                &format!("CachingAllocator option max_non_split_rounding_mb too small, must be >= {minimum}"),
            ));
        }
        self.max_non_split_rounding_size = mb.min(u64::MAX / MIB) * MIB;
        Ok(())
    }

    fn set_garbage_collection_threshold(&mut self, threshold: f64) -> Result<(), ConfigError> {
        if !(threshold > 0.0 && threshold < 1.0) {
            return Err(invalid(
                "garbage_collection_threshold",
                &threshold.to_string(),
                "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
            ));
        }
        self.garbage_collection_threshold = threshold;
        Ok(())
    }

    fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(invalid(
                "per_process_memory_fraction",
                &fraction.to_string(),
                "invalid fraction, please set within [0, 1]",
            ));
        }
        self.per_process_memory_fraction = fraction;
        Ok(())
    }

    /// The settings string this configuration came from ("" if built in code), as PyTorch shows
    /// it under `allocator_settings["PYTORCH_CUDA_ALLOC_CONF"]`.
    pub fn settings(&self) -> &str {
        &self.settings
    }

    /// Blocks of this size or more are "oversize": never split. `None` = unlimited (the default).
    pub fn max_split_size(&self) -> Option<u64> {
        (self.max_split_size != u64::MAX).then_some(self.max_split_size)
    }

    /// The raw threshold, `u64::MAX` when unlimited (PyTorch's `SIZE_MAX`).
    pub(crate) fn max_split_size_raw(&self) -> u64 {
        self.max_split_size
    }

    /// Slack an oversize request may accept from a cached oversize block.
    pub fn max_non_split_rounding_size(&self) -> u64 {
        self.max_non_split_rounding_size
    }

    /// Whether best fit's oversize rules keep a free block of `candidate` bytes from a request
    /// of `request` (rounded) bytes: an oversize block (`max_split_size_mb`) is not handed to a
    /// normal request, and an oversize request takes one only within
    /// `max_non_split_rounding_mb` of its size. Always false without `max_split_size_mb`.
    #[inline]
    pub fn oversize_rules_refuse(&self, request: u64, candidate: u64) -> bool {
        let max_split = self.max_split_size;
        (request < max_split && candidate >= max_split)
            || (request >= max_split && candidate >= request.saturating_add(self.max_non_split_rounding_size))
    }

    /// Segment size for 1–10 MiB requests and page size of large expandable segments.
    pub fn large_segment_size(&self) -> u64 {
        self.large_segment_size
    }

    /// `garbage_collection_threshold` (0 = off).
    pub fn garbage_collection_threshold(&self) -> f64 {
        self.garbage_collection_threshold
    }

    /// The 16-entry `roundup_power2_divisions` table.
    pub fn roundup_power2_divisions(&self) -> &RoundupDivisions {
        &self.roundup_power2_divisions
    }

    /// Whether new memory comes from expandable (VMM-mapped) segments.
    pub fn expandable_segments(&self) -> bool {
        self.expandable_segments
    }

    /// `per_process_memory_fraction` (1.0 = unlimited).
    pub fn per_process_memory_fraction(&self) -> f64 {
        self.per_process_memory_fraction
    }

    /// The `backend` key.
    pub fn backend(&self) -> AllocatorBackendKind {
        self.backend
    }

    /// `release_lock_on_cudamalloc` (parsed for completeness; the allocator is single-owner).
    pub fn release_lock_on_cudamalloc(&self) -> bool {
        self.release_lock_on_cudamalloc
    }

    /// `pinned_use_cuda_host_register` (host-memory key, parsed and reported).
    pub fn pinned_use_cuda_host_register(&self) -> bool {
        self.pinned_use_cuda_host_register
    }

    /// `pinned_num_register_threads` (host-memory key, parsed and reported).
    pub fn pinned_num_register_threads(&self) -> u64 {
        self.pinned_num_register_threads
    }

    /// `pinned_use_background_threads` (host-memory key, parsed and reported).
    pub fn pinned_use_background_threads(&self) -> bool {
        self.pinned_use_background_threads
    }

    /// `graph_capture_record_stream_reuse` (CUDA-graph key, parsed and reported).
    pub fn graph_capture_record_stream_reuse(&self) -> bool {
        self.graph_capture_record_stream_reuse
    }

    /// The placement policy (`policy:` key; PyTorch's unless `policy:cachalot` is set).
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Returns the configuration with `expandable_segments` switched (PyTorch allows this at
    /// run time; existing expandable blocks are then skipped by best fit).
    pub fn with_expandable_segments(mut self, enabled: bool) -> Self {
        self.expandable_segments = enabled;
        self
    }
}

/// Typed construction of an [`AllocatorConfig`] with PyTorch's validation.
///
/// The first invalid value is kept as the error that [`ConfigBuilder::build`] returns.
#[derive(Clone, Debug)]
pub struct ConfigBuilder {
    config: Result<AllocatorConfig, ConfigError>,
}

impl ConfigBuilder {
    fn update(mut self, f: impl FnOnce(&mut AllocatorConfig) -> Result<(), ConfigError>) -> Self {
        if let Ok(config) = &mut self.config
            && let Err(error) = f(config)
        {
            self.config = Err(error);
        }
        self
    }

    /// `max_split_size_mb`.
    pub fn max_split_size_mb(self, mb: u64) -> Self {
        self.update(|c| c.set_max_split_size_mb(mb))
    }
    /// `max_non_split_rounding_mb`.
    pub fn max_non_split_rounding_mb(self, mb: u64) -> Self {
        self.update(|c| c.set_max_non_split_rounding_mb(mb))
    }
    /// `large_segment_size_mb` (call before the two keys above, as PyTorch applies it first).
    pub fn large_segment_size_mb(self, mb: u64) -> Self {
        self.update(|c| c.set_large_segment_size_mb(mb))
    }
    /// `garbage_collection_threshold`, in (0, 1).
    pub fn garbage_collection_threshold(self, threshold: f64) -> Self {
        self.update(|c| c.set_garbage_collection_threshold(threshold))
    }
    /// `roundup_power2_divisions:N` for every interval.
    pub fn roundup_power2_divisions(self, divisions: u64) -> Self {
        self.update(|c| {
            check_division("roundup_power2_divisions", divisions)?;
            c.roundup_power2_divisions = [divisions; ROUNDUP_INTERVALS];
            Ok(())
        })
    }
    /// The full per-interval table (interval `i` covers `[2^(20+i), 2^(21+i))` bytes).
    pub fn roundup_power2_division_table(self, table: RoundupDivisions) -> Self {
        self.update(|c| {
            for divisions in table {
                check_division("roundup_power2_divisions", divisions)?;
            }
            c.roundup_power2_divisions = table;
            Ok(())
        })
    }
    /// `expandable_segments`.
    pub fn expandable_segments(self, enabled: bool) -> Self {
        self.update(|c| {
            c.expandable_segments = enabled;
            Ok(())
        })
    }
    /// `per_process_memory_fraction`, in [0, 1].
    pub fn per_process_memory_fraction(self, fraction: f64) -> Self {
        self.update(|c| c.set_memory_fraction(fraction))
    }
    /// `policy` (cachalot's own key).
    pub fn policy(self, policy: Policy) -> Self {
        self.update(|c| {
            c.policy = policy;
            Ok(())
        })
    }
    /// The finished configuration, or the first invalid value.
    pub fn build(self) -> Result<AllocatorConfig, ConfigError> {
        self.config
    }
}

/// Splits like PyTorch's lexer: `,` `:` `[` `]` are tokens of their own, spaces are dropped.
fn tokenize(settings: &str) -> Vec<&str> {
    let mut tokens = Vec::new();
    let mut start = None;
    for (i, ch) in settings.char_indices() {
        match ch {
            ',' | ':' | '[' | ']' | ' ' | '\t' | '\n' => {
                if let Some(s) = start.take() {
                    tokens.push(&settings[s..i]);
                }
                if ch != ' ' && ch != '\t' && ch != '\n' {
                    tokens.push(&settings[i..i + 1]);
                }
            }
            _ => {
                if start.is_none() {
                    start = Some(i);
                }
            }
        }
    }
    if let Some(s) = start {
        tokens.push(&settings[s..]);
    }
    tokens
}

/// Groups tokens into `key : value-tokens` entries separated by top-level commas.
fn split_entries<'a>(tokens: &[&'a str]) -> Result<Vec<(&'a str, Vec<&'a str>)>, ConfigError> {
    let mut entries = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let key = tokens[i];
        if matches!(key, "," | ":" | "[" | "]") {
            return Err(ConfigError::Syntax { expected: "a key".into(), after: key.into() });
        }
        if tokens.get(i + 1) != Some(&":") {
            return Err(ConfigError::Syntax { expected: ":".into(), after: key.into() });
        }
        i += 2;
        let mut value = Vec::new();
        let mut depth = 0usize;
        while i < tokens.len() {
            let t = tokens[i];
            match t {
                "[" => depth += 1,
                "]" => depth = depth.saturating_sub(1),
                "," if depth == 0 => break,
                _ => {}
            }
            value.push(t);
            i += 1;
        }
        if value.is_empty() {
            return Err(ConfigError::MissingValue { key: key.into() });
        }
        entries.push((key, value));
        if i < tokens.len() {
            i += 1; // the comma
            if i == tokens.len() {
                return Err(ConfigError::Syntax { expected: "a key".into(), after: ",".into() });
            }
        }
    }
    Ok(entries)
}

fn invalid(key: &str, value: &str, reason: &str) -> ConfigError {
    ConfigError::InvalidValue { key: key.into(), value: value.into(), reason: reason.into() }
}

fn single<'a>(key: &str, value: &[&'a str]) -> Result<&'a str, ConfigError> {
    match value {
        [one] => Ok(one),
        _ => Err(invalid(key, &value.concat(), "expected a single value")),
    }
}

fn parse_uint(key: &str, value: &[&str]) -> Result<u64, ConfigError> {
    let text = single(key, value)?;
    text.parse::<u64>().map_err(|_| invalid(key, text, "expected a non-negative integer"))
}

fn parse_float(key: &str, value: &[&str]) -> Result<f64, ConfigError> {
    let text = single(key, value)?;
    text.parse::<f64>().map_err(|_| invalid(key, text, "expected a number"))
}

fn parse_bool(key: &str, value: &[&str]) -> Result<bool, ConfigError> {
    match single(key, value)? {
        "True" => Ok(true),
        "False" => Ok(false),
        other => Err(invalid(key, other, &format!("Expected a single True/False argument for {key}"))),
    }
}

fn check_division(key: &str, divisions: u64) -> Result<(), ConfigError> {
    if divisions == 0 || divisions.is_power_of_two() {
        Ok(())
    } else {
        Err(invalid(
            key,
            &divisions.to_string(),
            "For roundups, the divisons has to be power of 2 or 0 to disable roundup",
        ))
    }
}

fn check_pinned_threads(threads: u64) -> Result<(), ConfigError> {
    let key = "pinned_num_register_threads";
    if !threads.is_power_of_two() {
        return Err(invalid(key, &threads.to_string(), "Number of register threads has to be power of 2"));
    }
    if threads > MAX_PINNED_REGISTER_THREADS {
        return Err(invalid(
            key,
            &threads.to_string(),
            &format!("Number of register threads should be less than or equal to {MAX_PINNED_REGISTER_THREADS}"),
        ));
    }
    Ok(())
}

/// `roundup_power2_divisions:N` or `roundup_power2_divisions:[MB:N,...,>:N]` (`docs/allocator-rules.md` §2).
fn parse_divisions(key: &str, value: &[&str]) -> Result<RoundupDivisions, ConfigError> {
    if let [single] = value {
        let divisions =
            single.parse::<u64>().map_err(|_| invalid(key, single, "expected a power of two or a [MB:N,...] list"))?;
        if !divisions.is_power_of_two() {
            return Err(invalid(key, single, "For roundups, the divisons has to be power of 2"));
        }
        return Ok([divisions; ROUNDUP_INTERVALS]);
    }
    let text = value.concat();
    if value.first() != Some(&"[") || value.last() != Some(&"]") {
        return Err(invalid(key, &text, "expected N or [MB:N,...,>:N]"));
    }
    let mut table = [0; ROUNDUP_INTERVALS];
    let inner = &value[1..value.len() - 1];
    let mut first = true;
    let mut last_index = 0usize;
    for pair in inner.split(|t| *t == ",") {
        let [interval, ":", divisions] = pair else {
            return Err(invalid(key, &text, "each entry must be MB:N or >:N"));
        };
        let divisions: u64 =
            divisions.parse().map_err(|_| invalid(key, &text, &format!("'{divisions}' is not an integer")))?;
        check_division(key, divisions)?;
        if *interval == ">" {
            for slot in &mut table[last_index + 1..] {
                *slot = divisions;
            }
            continue;
        }
        let mb: u64 =
            interval.parse().map_err(|_| invalid(key, &text, &format!("'{interval}' is not a size in MB")))?;
        if !mb.is_power_of_two() {
            return Err(invalid(key, &text, "For roundups, the intervals have to be power of 2"));
        }
        let index = (63 - mb.leading_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
        if first {
            for slot in &mut table[..index] {
                *slot = divisions;
            }
            first = false;
        }
        table[index] = divisions;
        last_index = index;
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_matches_pytorch() {
        let c = AllocatorConfig::parse("").unwrap();
        assert_eq!(c, AllocatorConfig::default());
        assert_eq!(c.max_split_size(), None);
        assert_eq!(c.large_segment_size(), 20 * MIB);
        assert_eq!(c.max_non_split_rounding_size(), 20 * MIB);
    }

    #[test]
    fn parses_the_reference_trace_settings() {
        let c = AllocatorConfig::parse("max_split_size_mb:64,roundup_power2_divisions:4").unwrap();
        assert_eq!(c.max_split_size(), Some(64 * MIB));
        assert_eq!(c.roundup_power2_divisions(), &[4; 16]);
        let c = AllocatorConfig::parse("garbage_collection_threshold:0.6").unwrap();
        assert_eq!(c.garbage_collection_threshold(), 0.6);
        let c = AllocatorConfig::parse("expandable_segments:True").unwrap();
        assert!(c.expandable_segments());
        assert_eq!(c.settings(), "expandable_segments:True");
    }

    /// PyTorch's AllocatorConfig test (`docs/allocator-rules.md` §2).
    #[test]
    fn division_list_fills_intervals_like_pytorch() {
        let c = AllocatorConfig::parse("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]").unwrap();
        let t = c.roundup_power2_divisions();
        assert_eq!(t[5], 8, "32 MiB");
        assert_eq!(t[6], 8, "64 MiB");
        assert_eq!(t[7], 2, "128 MiB");
        assert_eq!(t[8], 4, "256 MiB");
        assert_eq!(t[9], 2, "512 MiB");
        assert_eq!(t[10], 4, "1 GiB");
        assert!(t[11..].iter().all(|&d| d == 1), "2 GiB and up");
        assert_eq!(t[0], 8, "the first pair fills the intervals below it");
    }

    #[test]
    fn spaces_are_ignored() {
        let c = AllocatorConfig::parse(" max_split_size_mb : 100 , expandable_segments:False").unwrap();
        assert_eq!(c.max_split_size(), Some(100 * MIB));
    }

    #[test]
    fn large_segment_size_applies_first() {
        let c = AllocatorConfig::parse("max_split_size_mb:40,large_segment_size_mb:40").unwrap();
        assert_eq!(c.large_segment_size(), 40 * MIB);
        assert_eq!(c.max_non_split_rounding_size(), 40 * MIB);
        let err = AllocatorConfig::parse("max_split_size_mb:30,large_segment_size_mb:40").unwrap_err();
        assert!(err.to_string().contains("max_split_size_mb too small, must be >= 40"), "{err}");
    }

    #[test]
    fn errors_name_the_key() {
        let err = AllocatorConfig::parse("bogus_option:1").unwrap_err();
        assert_eq!(err.to_string(), "Unrecognized key 'bogus_option' in CUDA allocator config.");
        for (settings, key) in [
            ("max_split_size_mb:10", "max_split_size_mb"),
            ("max_split_size_mb:ten", "max_split_size_mb"),
            ("garbage_collection_threshold:1.5", "garbage_collection_threshold"),
            ("expandable_segments:yes", "expandable_segments"),
            ("roundup_power2_divisions:3", "roundup_power2_divisions"),
            ("roundup_power2_divisions:[3:4]", "roundup_power2_divisions"),
            ("per_process_memory_fraction:2", "per_process_memory_fraction"),
            ("pinned_num_register_threads:256", "pinned_num_register_threads"),
            ("backend:magic", "backend"),
            ("large_segment_size_mb:10", "large_segment_size_mb"),
            ("large_segment_size_mb:17592186044416", "large_segment_size_mb"),
            ("large_segment_size_mb:17592186044417", "large_segment_size_mb"),
            ("large_segment_size_mb:18446744073709551615", "large_segment_size_mb"),
            ("max_split_size_mb:18446744073709551616", "max_split_size_mb"),
            ("garbage_collection_threshold:NaN", "garbage_collection_threshold"),
            ("per_process_memory_fraction:NaN", "per_process_memory_fraction"),
            ("per_process_memory_fraction:-inf", "per_process_memory_fraction"),
            ("roundup_power2_divisions:[18446744073709551616:4]", "roundup_power2_divisions"),
            ("pinned_num_register_threads:0", "pinned_num_register_threads"),
        ] {
            let err = AllocatorConfig::parse(settings).unwrap_err();
            assert!(err.to_string().contains(key), "{settings}: {err}");
        }
        assert!(matches!(AllocatorConfig::parse("max_split_size_mb:").unwrap_err(), ConfigError::MissingValue { .. }));
        assert!(matches!(AllocatorConfig::parse("max_split_size_mb 64").unwrap_err(), ConfigError::Syntax { .. }));
    }

    /// Values that would wrap when turned into bytes are refused, never wrapped to a small size;
    /// PyTorch's own clamp of the split limits to `SIZE_MAX` is kept.
    #[test]
    fn mib_values_never_wrap() {
        let largest = AllocatorConfig::parse(&format!("large_segment_size_mb:{MAX_LARGE_SEGMENT_SIZE_MB}")).unwrap();
        assert_eq!(largest.large_segment_size(), MAX_REQUEST);
        let err = AllocatorConfig::parse("large_segment_size_mb:17592186044417").unwrap_err();
        assert!(err.to_string().contains("at most 1099511627776"), "{err}");
        let c = AllocatorConfig::parse("max_split_size_mb:18446744073709551615").unwrap();
        assert_eq!(c.max_split_size(), Some(u64::MAX / MIB * MIB));
        assert!(AllocatorConfig::builder().large_segment_size_mb(u64::MAX).build().is_err());
    }

    #[test]
    fn every_2_11_key_is_accepted() {
        let all = "large_segment_size_mb:20,max_split_size_mb:64,max_non_split_rounding_mb:32,\
                   garbage_collection_threshold:0.5,roundup_power2_divisions:[1:4,>:8],\
                   expandable_segments:False,pinned_use_background_threads:True,backend:native,\
                   release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,\
                   pinned_num_register_threads:8,pinned_reserve_segment_size_mb:64,\
                   graph_capture_record_stream_reuse:True,per_process_memory_fraction:0.5";
        let c = AllocatorConfig::parse(all).unwrap();
        assert_eq!(c.max_non_split_rounding_size(), 32 * MIB);
        assert_eq!(c.per_process_memory_fraction(), 0.5);
        assert_eq!(c.pinned_num_register_threads(), 8);
    }

    #[test]
    fn policy_key_selects_cachalots_policy() {
        assert_eq!(AllocatorConfig::default().policy(), Policy::PyTorch);
        let c = AllocatorConfig::parse("policy:cachalot,max_split_size_mb:64").unwrap();
        assert_eq!(c.policy(), Policy::Cachalot);
        assert_eq!(c.max_split_size(), Some(64 * MIB));
        assert_eq!(AllocatorConfig::parse("policy:pytorch").unwrap().policy(), Policy::PyTorch);
        let err = AllocatorConfig::parse("policy:best").unwrap_err();
        assert!(err.to_string().contains("'best' for 'policy'"), "{err}");
        let built = AllocatorConfig::builder().policy(Policy::Cachalot).build().unwrap();
        assert_eq!(built.policy(), Policy::Cachalot);
    }

    #[test]
    fn builder_validates_like_the_parser() {
        assert!(AllocatorConfig::builder().max_split_size_mb(19).build().is_err());
        assert!(AllocatorConfig::builder().garbage_collection_threshold(0.0).build().is_err());
        assert!(AllocatorConfig::builder().roundup_power2_divisions(6).build().is_err());
        let c = AllocatorConfig::builder().expandable_segments(true).per_process_memory_fraction(0.25).build().unwrap();
        assert!(c.expandable_segments());
        assert_eq!(c.per_process_memory_fraction(), 0.25);
    }
}
