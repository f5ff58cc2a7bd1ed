//! Errors the engine reports to its callers. Messages follow SQL Server's wording where SQL
//! Server has the error, so a DBA recognises them.

use lastpage_storage::btree::IntegrityError;
use lastpage_storage::buffer::PoolFull;

use crate::types::ValueError;

/// Every error the embedded API can return.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// A value does not fit its column (type, range, length).
    #[error("{0}")]
    Value(#[from] ValueError),
    /// No table of that name.
    #[error("Invalid object name '{0}'.")]
    UnknownTable(String),
    /// No column of that name in the table.
    #[error("Invalid column name '{column}' in table '{table}'.")]
    UnknownColumn {
        /// The table.
        table: String,
        /// The column asked for.
        column: String,
    },
    /// No index of that name on the table.
    #[error("Index '{index}' on table '{table}' does not exist.")]
    UnknownIndex {
        /// The table.
        table: String,
        /// The index asked for.
        index: String,
    },
    /// A table of that name exists already.
    #[error("There is already an object named '{0}' in the database.")]
    TableExists(String),
    /// The table definition is not valid.
    #[error("Invalid definition of table '{table}': {reason}")]
    InvalidDefinition {
        /// The table.
        table: String,
        /// What is wrong with it.
        reason: String,
    },
    /// NULL into a NOT NULL column (SQL Server's error 515, which names the statement).
    #[error(
        "Cannot insert the value NULL into column '{column}', table '{table}'; column does not allow nulls. {statement} fails."
    )]
    NullNotAllowed {
        /// The table.
        table: String,
        /// The column.
        column: String,
        /// The statement that failed: "INSERT" or "UPDATE".
        statement: &'static str,
    },
    /// A primary key or unique constraint is violated.
    #[error(
        "Violation of {constraint_kind} constraint '{constraint}'. Cannot insert duplicate key in object '{table}'. The duplicate key value is ({key})."
    )]
    DuplicateKey {
        /// "PRIMARY KEY" or "UNIQUE KEY".
        constraint_kind: &'static str,
        /// The constraint (index) name.
        constraint: String,
        /// The table.
        table: String,
        /// The duplicate key, as text.
        key: String,
    },
    /// A unique index that is not a constraint is violated.
    #[error(
        "Cannot insert duplicate key row in object '{table}' with unique index '{index}'. The duplicate key value is ({key})."
    )]
    DuplicateIndexKey {
        /// The index.
        index: String,
        /// The table.
        table: String,
        /// The duplicate key, as text.
        key: String,
    },
    /// The encoded row exceeds the page's row limit.
    #[error(
        "Cannot create a row of size {size} which is greater than the allowable maximum row size of {max}."
    )]
    RowTooLarge {
        /// The row's size, in bytes.
        size: usize,
        /// The limit, in bytes.
        max: usize,
    },
    /// The encoded key of an index exceeds the key limit.
    #[error(
        "The key of index '{index}' is {size} bytes, which exceeds the maximum key length of {max} bytes."
    )]
    KeyTooLarge {
        /// The index.
        index: String,
        /// The key's size, in bytes.
        size: usize,
        /// The limit, in bytes.
        max: usize,
    },
    /// A value was given for an identity column.
    #[error(
        "Cannot insert explicit value for identity column in table '{table}' when IDENTITY_INSERT is set to OFF."
    )]
    ExplicitIdentity {
        /// The table.
        table: String,
    },
    /// An identity or computed column was given a value in an update.
    #[error(
        "Cannot update column '{column}' of table '{table}': it is an identity or computed column."
    )]
    ReadOnlyColumn {
        /// The table.
        table: String,
        /// The column.
        column: String,
    },
    /// A value was given for a computed column on insert.
    #[error(
        "The column \"{column}\" cannot be modified because it is either a computed column or is the result of a UNION operator."
    )]
    ComputedColumn {
        /// The column.
        column: String,
    },
    /// An insert with a column list (prepared or multi-row) named a column twice in it.
    #[error(
        "The column name '{column}' is specified more than once in the column list of an INSERT. A column cannot be assigned more than one value in the same clause."
    )]
    DuplicateInsertColumn {
        /// The column.
        column: String,
    },
    /// An update named a column twice in its changes (SQL Server's error 264).
    #[error(
        "The column name '{column}' is specified more than once in the SET clause or column list of an UPDATE. A column cannot be assigned more than one value in the same clause. Modify the clause to make sure that a column is updated only once."
    )]
    DuplicateUpdateColumn {
        /// The column.
        column: String,
    },
    /// A row of an insert with a column list (prepared or multi-row) has a different number of
    /// values than the list.
    #[error(
        "Row {row} of the INSERT has {got} values for {expected} columns: the number of values must match the number of columns specified in the INSERT statement."
    )]
    InsertArity {
        /// The row, counted from 1.
        row: usize,
        /// The columns the statement names.
        expected: usize,
        /// The values the row has.
        got: usize,
    },
    /// A computed column's expression divided by zero (SQL Server's error 8134).
    #[error("Divide by zero error encountered.")]
    DivideByZero,
    /// A computed column's expression overflowed (SQL Server's error 8115).
    #[error("Arithmetic overflow error converting expression to data type {data_type}.")]
    ArithmeticOverflow {
        /// The type the result did not fit.
        data_type: String,
    },
    /// The identity column ran out of values.
    #[error("Arithmetic overflow error converting IDENTITY to data type {data_type}.")]
    IdentityOverflow {
        /// The identity column's type.
        data_type: String,
    },
    /// A key lookup got the wrong number of values.
    #[error("The key of index '{index}' has {expected} columns, but {got} values were given.")]
    KeyArity {
        /// The index.
        index: String,
        /// Columns in the key.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// The buffer pool is out of pages.
    #[error(transparent)]
    PoolFull(#[from] PoolFull),
    /// A lock request timed out (SQL Server's error 1222, with its message). The engine makes
    /// it from the lock manager's error together with the requesting session, never from a
    /// [`crate::locks::LockError`] alone: a deadlock becomes [`EngineError::Deadlock`], which
    /// names the session.
    #[error(transparent)]
    Lock(crate::locks::LockError),
    /// The statement's transaction was chosen as a deadlock victim (SQL Server's error 1205): it
    /// must be rolled back, which releases its locks and lets the rest of the cycle go on.
    #[error(
        "Transaction (Process ID {process_id}) was deadlocked on lock resources with another process and has been chosen as the deadlock victim. Rerun the transaction."
    )]
    Deadlock {
        /// The victim's session id ([`crate::Session::id`]), as SQL Server's message names the
        /// session (its SPID), which stays the same for the session's life, and not the
        /// transaction.
        process_id: u64,
    },
    /// A transaction statement in the wrong state (COMMIT without BEGIN, nested BEGIN).
    #[error("{0}")]
    Transaction(String),
    /// The log could not be made durable: this commit was not acknowledged, and the database
    /// refuses everything from now on.
    #[error("{0}")]
    LogFailed(String),
    /// A function the caller supplied (a computed column's expression or a function default)
    /// panicked. The statement failed and was undone like any failed statement; the panic
    /// did not cross the engine.
    #[error("the function of column '{column}' in table '{table}' panicked: {message}")]
    FunctionPanicked {
        /// The table.
        table: String,
        /// The column whose expression or default it is.
        column: String,
        /// The panic's message, if it had one.
        message: String,
    },
    /// The database stopped after a log failure, a checkpoint that could not write or sync the
    /// data file, or a rollback that could not undo all of its changes; reopening it recovers
    /// from the log.
    #[error("the database stopped and must be reopened to recover: {0}")]
    DatabaseFailed(String),
    /// `Database::close` shut the database down; a clone of its handle cannot go on using it.
    #[error("the database was closed (Database::close); open it again to go on")]
    DatabaseClosed,
    /// A table cannot be stored in a durable database's catalog, because a column holds a
    /// closure (a computed expression or a function default) or a default that does not fit
    /// its column.
    #[error("table '{table}' cannot be stored in a durable database: column '{column}' {reason}")]
    NotPersistable {
        /// The table.
        table: String,
        /// The column.
        column: String,
        /// What about the column cannot be stored, and why.
        reason: String,
    },
    /// A catalog to encode is inconsistent (its trees do not match its indexes, ids repeat,
    /// ...), so the blob would not decode again.
    #[error("The catalog cannot be encoded: {0}")]
    InvalidCatalog(String),
    /// A stored catalog failed to decode: it is corrupt, truncated or of an unknown version.
    #[error("The stored catalog is corrupt: {0}")]
    CorruptCatalog(String),
    /// A page could not be read from or written to the data file, or is corrupt there.
    #[error("storage error: {0}")]
    Storage(String),
    /// The integrity check found a broken invariant.
    #[error("integrity check failed: {0}")]
    Integrity(String),
}

impl EngineError {
    /// The error of a lock request of session `process_id` that failed: a timeout as it is, a
    /// deadlock naming the session. (There is no `From<LockError>`, so that no lock failure
    /// reaches a caller without its session.)
    pub(crate) fn from_lock(error: crate::locks::LockError, process_id: u64) -> EngineError {
        match error {
            crate::locks::LockError::Deadlock { .. } => EngineError::Deadlock { process_id },
            timeout => EngineError::Lock(timeout),
        }
    }
}

impl From<IntegrityError> for EngineError {
    fn from(error: IntegrityError) -> Self {
        EngineError::Integrity(error.to_string())
    }
}

/// An error reading the log back (recovery, a rollback from the log). A failure of the log
/// writer itself is not made this way: `Database::fail` makes it, and stops the database.
impl From<lastpage_storage::wal::WalError> for EngineError {
    fn from(error: lastpage_storage::wal::WalError) -> Self {
        EngineError::Storage(error.to_string())
    }
}

/// The engine's result type.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
