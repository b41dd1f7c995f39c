//! The kinds of request an object tier makes, named in its errors, its
//! statistics and the record of each request's last attempt: a module of its
//! own so that the errors and the attempt records both name it without
//! naming each other.

/// The kinds of request a tier makes, for errors and statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    Get,
    /// PUTs of part objects.
    Put,
    Delete,
    List,
    /// Conditional PUTs of the tier's label: one per open and one per
    /// committed flush (decision 0034).
    LabelPut,
}

impl std::fmt::Display for RequestKind {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let word = match self {
            Self::Get => "GET",
            Self::Put => "PUT",
            Self::Delete => "DELETE",
            Self::List => "LIST",
            Self::LabelPut => "PUT (label)",
        };
        formatter.write_str(word)
    }
}
