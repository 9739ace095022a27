//! What a flag takes, read from its clap definition, so that a config file's value can be checked
//! against it and written back in the same shape: a switch is `true`/`false`, a number flag a
//! TOML number, a flag that takes several values (repeated, comma-separated, or several after
//! it) an array.

use clap::{Arg, ArgAction};
use std::any::TypeId;

/// The type of one value, from the flag's value parser.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scalar {
    Bool,
    Integer,
    Float,
    /// Text: strings, paths, and every type parsed from text (`--device`, `--env`, ...).
    Text,
}

/// How several values of one flag go on a command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Joining {
    /// The flag once per value (`--sandbox-bind A --sandbox-bind B`).
    Repeated,
    /// One argument, the values joined (`--seq-lens 128,512`).
    Delimited(char),
    /// The flag once, the values after it.
    Following,
}

/// What a flag takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlagKind {
    /// Given or not (`--resume`): `true` or `false` in a file.
    Switch {
        given_means: bool,
    },
    /// Counted (`-vvv`): an integer in a file.
    Count,
    One(Scalar),
    Many(Scalar, Joining),
}

impl Scalar {
    fn of(arg: &Arg) -> Self {
        let id = arg.get_value_parser().type_id();
        let is = |t: TypeId| id == t;
        if is(TypeId::of::<bool>()) {
            Scalar::Bool
        } else if [
            TypeId::of::<u8>(),
            TypeId::of::<u16>(),
            TypeId::of::<u32>(),
            TypeId::of::<u64>(),
            TypeId::of::<usize>(),
            TypeId::of::<i8>(),
            TypeId::of::<i16>(),
            TypeId::of::<i32>(),
            TypeId::of::<i64>(),
            TypeId::of::<isize>(),
        ]
        .into_iter()
        .any(is)
        {
            Scalar::Integer
        } else if is(TypeId::of::<f32>()) || is(TypeId::of::<f64>()) {
            Scalar::Float
        } else {
            Scalar::Text
        }
    }

    /// What the file must hold, in words.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Scalar::Bool => "true or false",
            Scalar::Integer => "an integer",
            Scalar::Float => "a number",
            Scalar::Text => "a string",
        }
    }
}

impl FlagKind {
    pub(crate) fn of(arg: &Arg) -> Self {
        match arg.get_action() {
            ArgAction::SetTrue => return FlagKind::Switch { given_means: true },
            ArgAction::SetFalse => return FlagKind::Switch { given_means: false },
            ArgAction::Count => return FlagKind::Count,
            _ => {}
        }
        let scalar = Scalar::of(arg);
        let max_values = arg.get_num_args().map_or(1, |r| r.max_values());
        if matches!(arg.get_action(), ArgAction::Append) {
            FlagKind::Many(scalar, Joining::Repeated)
        } else if let Some(delimiter) = arg.get_value_delimiter() {
            FlagKind::Many(scalar, Joining::Delimited(delimiter))
        } else if max_values > 1 {
            FlagKind::Many(scalar, Joining::Following)
        } else {
            FlagKind::One(scalar)
        }
    }

    /// What the file must hold, in words.
    pub(crate) fn describe(self) -> String {
        match self {
            FlagKind::Switch { .. } => "true or false".into(),
            FlagKind::Count => "an integer (how many times the flag is given)".into(),
            FlagKind::One(scalar) => scalar.describe().into(),
            FlagKind::Many(scalar, _) => format!("an array, each element {}", scalar.describe()),
        }
    }
}
