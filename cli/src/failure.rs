//! How a subcommand fails: the message and the exit status (1: a difference found, 2: bad
//! input or usage).

/// A failure of a command: its message and the exit status it should give.
#[derive(Debug)]
pub struct Failure {
    /// 1: the command ran and found a difference; 2: bad input or usage.
    pub status: u8,
    /// What went wrong.
    pub error: anyhow::Error,
}

impl Failure {
    /// Bad input: exit status 2.
    pub fn input(error: anyhow::Error) -> Self {
        Failure { status: 2, error }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Failure::input(error)
    }
}

/// What a command returns.
pub type Outcome = Result<(), Failure>;
