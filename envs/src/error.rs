//! The one error type of the environments crate.

/// What can go wrong when building or driving an environment.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EnvError {
    /// The id names no known environment.
    #[error("unknown environment '{id}'; known environments: {}, or gym:<id> for any Gymnasium environment (e.g. gym:CartPole-v1, gym:ALE/Breakout-v5?preset=atari)", known.join(", "))]
    UnknownId { id: String, known: Vec<String> },
    /// An option in the id's query string is not accepted by that environment.
    #[error("environment '{id}' has no option '{option}'; allowed options: {}", allowed.join(", "))]
    UnknownOption {
        id: String,
        option: String,
        allowed: Vec<String>,
    },
    /// An option has a value outside what the environment accepts.
    #[error("environment '{id}': option '{option}' = '{value}' is invalid: expected {expected}")]
    BadOptionValue {
        id: String,
        option: String,
        value: String,
        expected: String,
    },
    /// The action index is outside the action space.
    #[error("action {action} is out of range: this environment accepts actions 0..{n} (0 to {})", n - 1)]
    InvalidAction { action: usize, n: usize },
    /// The caller's observation buffer has the wrong length.
    #[error(
        "observation buffer has length {got}, expected {expected} (the observation space's len())"
    )]
    ObservationBuffer { expected: usize, got: usize },
    /// `step` was called before the first `reset`, or after the episode ended where the
    /// environment does not define that.
    #[error("{0}: call reset() first")]
    NeedsReset(String),
    /// The environment has no [`render`](crate::Env::render) method.
    #[error("environment '{id}' cannot render frames, so no video can be made of it (classic/cartpole, the minatar/ games and gym: ids render)")]
    CannotRender { id: String },
    /// An outside environment (a Python worker, say) failed.
    #[error("{0}")]
    External(String),
}
