//! PyTorch 2.11's cuBLAS and cuBLASLt workspace sizes (`aten/src/ATen/cuda/CublasHandlePool.cpp`,
//! `docs/allocator-rules.md` §20).

/// The default cuBLAS workspace on compute capability majors 9, 10 and 12 (Hopper, Blackwell):
/// `:4096:8` = 32 MiB.
pub const CUBLAS_WORKSPACE_LARGE: u64 = 4096 * 8 * 1024;

/// The default cuBLAS workspace elsewhere: `:4096:2:16:8` = 8,519,680 bytes (8.125 MiB).
pub const CUBLAS_WORKSPACE_DEFAULT: u64 = 4096 * 1024 * 2 + 16 * 1024 * 8;

/// The default cuBLASLt workspace: `CUBLASLT_WORKSPACE_SIZE` = 1024 KiB.
pub const CUBLASLT_WORKSPACE_DEFAULT: u64 = 1024 * 1024;

/// The two persistent workspaces PyTorch 2.11 takes from its caching allocator, per stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkspaceSizes {
    /// Bytes of the cuBLAS workspace (`getChosenWorkspaceSize()`), allocated on the first
    /// matrix product of a stream.
    pub cublas: u64,
    /// Bytes of the separate cuBLASLt workspace (`getCUDABlasLtWorkspaceSize()`), allocated on
    /// the first linear layer with bias of a stream.
    pub cublaslt: u64,
}

impl WorkspaceSizes {
    /// The sizes PyTorch 2.11 chooses on a device of compute capability `major`, given the values
    /// of `CUBLAS_WORKSPACE_CONFIG` and `CUBLASLT_WORKSPACE_SIZE` (`None` when unset).
    ///
    /// ```
    /// use cachalot_cuda::WorkspaceSizes;
    /// let hopper = WorkspaceSizes::pytorch(9, None, None);
    /// assert_eq!((hopper.cublas, hopper.cublaslt), (33_554_432, 1_048_576));
    /// assert_eq!(WorkspaceSizes::pytorch(8, None, None).cublas, 8_519_680);
    /// assert_eq!(WorkspaceSizes::pytorch(9, Some(":4096:2:16:8"), None).cublas, 8_519_680);
    /// ```
    pub fn pytorch(major: i32, cublas_workspace_config: Option<&str>, cublaslt_workspace_size: Option<&str>) -> Self {
        let default = if matches!(major, 9 | 10 | 12) { CUBLAS_WORKSPACE_LARGE } else { CUBLAS_WORKSPACE_DEFAULT };
        let cublas = match cublas_workspace_config {
            Some(config) => parse_cublas_workspace_config(config).unwrap_or_else(|| {
                tracing::warn!(
                    "Could not parse CUBLAS_WORKSPACE_CONFIG, using default workspace size of {default} bytes."
                );
                default
            }),
            None => default,
        };
        let cublaslt = cublaslt_workspace_size
            .and_then(|kib| kib.trim().parse::<u64>().ok())
            .map_or(CUBLASLT_WORKSPACE_DEFAULT, |kib| kib.saturating_mul(1024));
        WorkspaceSizes { cublas, cublaslt }
    }

    /// [`WorkspaceSizes::pytorch`] with the two variables read from the environment.
    pub fn from_env(major: i32) -> Self {
        let config = std::env::var("CUBLAS_WORKSPACE_CONFIG").ok();
        let lt = std::env::var("CUBLASLT_WORKSPACE_SIZE").ok();
        Self::pytorch(major, config.as_deref(), lt.as_deref())
    }
}

/// `CUBLAS_WORKSPACE_CONFIG` as PyTorch reads it: the sum over every match of
/// `:([0-9]+):([0-9]+)` (left to right, not overlapping) of `SIZE_KiB * 1024 * COUNT`; `None`
/// when nothing matches.
///
/// ```
/// use cachalot_cuda::parse_cublas_workspace_config;
/// assert_eq!(parse_cublas_workspace_config(":4096:8"), Some(33_554_432));
/// assert_eq!(parse_cublas_workspace_config(":4096:2:16:8"), Some(8_519_680));
/// assert_eq!(parse_cublas_workspace_config("garbage"), None);
/// ```
pub fn parse_cublas_workspace_config(config: &str) -> Option<u64> {
    let bytes = config.as_bytes();
    let digits = |from: usize| bytes[from..].iter().take_while(|b| b.is_ascii_digit()).count();
    let number = |from: usize, len: usize| {
        config[from..from + len].bytes().fold(0u64, |n, b| n.saturating_mul(10).saturating_add(u64::from(b - b'0')))
    };
    let mut total: Option<u64> = None;
    let mut i = 0;
    while i < bytes.len() {
        // A match at i: ':' digits ':' digits (digits are greedy, as in std::regex).
        if bytes[i] == b':' {
            let size_len = digits(i + 1);
            let colon = i + 1 + size_len;
            if size_len > 0 && colon < bytes.len() && bytes[colon] == b':' {
                let count_len = digits(colon + 1);
                if count_len > 0 {
                    let size = number(i + 1, size_len);
                    let count = number(colon + 1, count_len);
                    let add = size.saturating_mul(1024).saturating_mul(count);
                    total = Some(total.unwrap_or(0).saturating_add(add));
                    i = colon + 1 + count_len;
                    continue;
                }
            }
        }
        i += 1;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_architecture_rule_of_pytorch_2_11() {
        for major in [9, 10, 12] {
            assert_eq!(WorkspaceSizes::pytorch(major, None, None).cublas, 33_554_432, "sm_{major}x");
        }
        for major in [6, 7, 8, 11] {
            assert_eq!(WorkspaceSizes::pytorch(major, None, None).cublas, 8_519_680, "sm_{major}x");
        }
        assert_eq!(WorkspaceSizes::pytorch(8, None, None).cublaslt, 1 << 20);
    }

    #[test]
    fn environment_overrides() {
        assert_eq!(WorkspaceSizes::pytorch(9, Some(":16:8"), None).cublas, 131_072);
        assert_eq!(WorkspaceSizes::pytorch(8, Some(":4096:8"), None).cublas, 33_554_432);
        // Unparseable: PyTorch warns and keeps the default.
        assert_eq!(WorkspaceSizes::pytorch(9, Some("4096"), None).cublas, 33_554_432);
        assert_eq!(WorkspaceSizes::pytorch(9, None, Some("2048")).cublaslt, 2 << 20);
        assert_eq!(WorkspaceSizes::pytorch(9, None, Some("lots")).cublaslt, 1 << 20);
    }

    #[test]
    fn config_matches_like_the_regex() {
        assert_eq!(parse_cublas_workspace_config(":0:8"), Some(0));
        assert_eq!(parse_cublas_workspace_config("x:1:2y:3:4"), Some(1024 * 2 + 3 * 1024 * 4));
        // ":1:2:3" matches ":1:2" only; the rest ":3" cannot match.
        assert_eq!(parse_cublas_workspace_config(":1:2:3"), Some(2048));
        assert_eq!(parse_cublas_workspace_config("::1:2"), Some(2048));
        assert_eq!(parse_cublas_workspace_config(":1:"), None);
        assert_eq!(parse_cublas_workspace_config(""), None);
    }
}
