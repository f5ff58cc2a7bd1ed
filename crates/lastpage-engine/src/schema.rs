//! Table definitions: columns, identity, defaults, computed columns and indexes.

use std::fmt;
use std::sync::Arc;

use lastpage_storage::btree::InsertPath;
use lastpage_storage::latch::LatchPolicy;

use crate::error::Result;
use crate::types::{DataType, Value};

/// How a column gets a value when an insert does not supply one.
#[derive(Clone)]
pub enum DefaultValue {
    /// A constant.
    Constant(Value),
    /// The current UTC date and time (`SYSUTCDATETIME()`).
    CurrentUtcDateTime,
    /// A new random GUID (`NEWID()`).
    NewId,
    /// Anything else the SQL layer can compute without looking at the row.
    Function(Arc<dyn Fn() -> Result<Value> + Send + Sync>),
}

impl fmt::Debug for DefaultValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DefaultValue::Constant(value) => write!(f, "Constant({value:?})"),
            DefaultValue::CurrentUtcDateTime => f.write_str("CurrentUtcDateTime"),
            DefaultValue::NewId => f.write_str("NewId"),
            DefaultValue::Function(_) => f.write_str("Function(..)"),
        }
    }
}

/// IDENTITY(seed, increment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The first value handed out.
    pub seed: i64,
    /// The step between values (may be negative, never zero).
    pub increment: i64,
}

/// The expression of a persisted computed column: it sees the row's values (computed columns
/// are evaluated in column order: later ones are still NULL, earlier ones hold their results,
/// and no value is converted to its column's type yet) and returns this column's value.
/// The SQL layer supplies it; the engine evaluates it on every insert and update.
pub type ComputeFn = Arc<dyn Fn(&[Value]) -> Result<Value> + Send + Sync>;

/// A computed column's expression in a form a durable database's catalog stores: the integer
/// arithmetic of the seeds' hash keys, `ABS(InsertID % 16)`. Operands are integers (an
/// integer column's value, or a constant); a NULL operand makes the result NULL, and the
/// result (a `bigint`) is converted to the column's type when the row is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    /// The value of an integer column of the same row, by name, converted to the column's type
    /// (text, a decimal or money given for it counts as the integer the row stores). A computed
    /// column that comes later in the table is still NULL when this one is evaluated.
    Column(String),
    /// An integer constant.
    Integer(i64),
    /// `left % right`, as T-SQL computes it: the result has the sign of `left`; a zero `right`
    /// fails the statement ("Divide by zero error encountered.").
    Modulo(Box<Expr>, Box<Expr>),
    /// `ABS(operand)`, an `int` for an `int`, `smallint` or `tinyint` operand (or a `%` of
    /// those) and a `bigint` for a `bigint` one, as in T-SQL; a result that does not fit that
    /// type (the absolute value of the smallest `int` or `bigint`) fails the statement with an
    /// arithmetic overflow.
    Abs(Box<Expr>),
}

impl Expr {
    /// The value of column `name`.
    pub fn column(name: impl Into<String>) -> Expr {
        Expr::Column(name.into())
    }

    /// `self % divisor`.
    pub fn modulo(self, divisor: i64) -> Expr {
        Expr::Modulo(Box::new(self), Box::new(Expr::Integer(divisor)))
    }

    /// `ABS(self)`.
    pub fn abs(self) -> Expr {
        Expr::Abs(Box::new(self))
    }

    /// How deeply the expression nests (a column or a constant is 1).
    pub fn depth(&self) -> usize {
        match self {
            Expr::Column(_) | Expr::Integer(_) => 1,
            Expr::Modulo(left, right) => 1 + left.depth().max(right.depth()),
            Expr::Abs(operand) => 1 + operand.depth(),
        }
    }

    /// Every column the expression reads.
    pub fn columns(&self) -> Vec<&str> {
        match self {
            Expr::Column(name) => vec![name.as_str()],
            Expr::Integer(_) => Vec::new(),
            Expr::Modulo(left, right) => {
                let mut columns = left.columns();
                columns.extend(right.columns());
                columns
            }
            Expr::Abs(operand) => operand.columns(),
        }
    }
}

impl fmt::Display for Expr {
    /// The expression as T-SQL writes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Column(name) => write!(f, "[{name}]"),
            Expr::Integer(value) => write!(f, "{value}"),
            Expr::Modulo(left, right) => write!(f, "({left} % {right})"),
            Expr::Abs(operand) => write!(f, "ABS({operand})"),
        }
    }
}

/// How a computed column gets its value.
#[derive(Clone)]
pub enum Computed {
    /// An expression the catalog stores, so a durable database accepts the column.
    Expression(Expr),
    /// A function the caller supplies: it cannot be stored, so only an in-memory database
    /// accepts the column.
    Function(ComputeFn),
}

impl fmt::Debug for Computed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Computed::Expression(expr) => write!(f, "Expression({expr})"),
            Computed::Function(_) => f.write_str("Function"),
        }
    }
}

/// One column.
#[derive(Clone)]
pub struct ColumnDef {
    /// The name, unique in the table (compared case-insensitively, as SQL Server does).
    pub name: String,
    /// The type.
    pub data_type: DataType,
    /// Whether NULL is allowed.
    pub nullable: bool,
    /// The default, if any.
    pub default: Option<DefaultValue>,
    /// IDENTITY, if this is the identity column.
    pub identity: Option<Identity>,
    /// How the value is computed, if this is a persisted computed column.
    pub computed: Option<Computed>,
}

impl fmt::Debug for ColumnDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ColumnDef")
            .field("name", &self.name)
            .field("data_type", &self.data_type)
            .field("nullable", &self.nullable)
            .field("default", &self.default)
            .field("identity", &self.identity)
            .field("computed", &self.computed)
            .finish()
    }
}

impl ColumnDef {
    /// A nullable column with no default.
    pub fn new(name: impl Into<String>, data_type: DataType) -> Self {
        ColumnDef {
            name: name.into(),
            data_type,
            nullable: true,
            default: None,
            identity: None,
            computed: None,
        }
    }

    /// Disallows NULL.
    pub fn not_null(mut self) -> Self {
        self.nullable = false;
        self
    }

    /// Makes this the IDENTITY(seed, increment) column (which is NOT NULL).
    pub fn identity(mut self, seed: i64, increment: i64) -> Self {
        self.identity = Some(Identity { seed, increment });
        self.nullable = false;
        self
    }

    /// Sets the default.
    pub fn default_value(mut self, default: DefaultValue) -> Self {
        self.default = Some(default);
        self
    }

    /// Makes this a persisted computed column whose value a function computes (an in-memory
    /// database only: a function cannot be stored).
    pub fn computed(mut self, expression: ComputeFn) -> Self {
        self.computed = Some(Computed::Function(expression));
        self
    }

    /// Makes this a persisted computed column whose value `expression` computes, which a
    /// durable database stores in its catalog (`ModValue AS ABS(InsertID % 16) PERSISTED`).
    pub fn computed_expression(mut self, expression: Expr) -> Self {
        self.computed = Some(Computed::Expression(expression));
        self
    }
}

/// What kind of uniqueness an index enforces, which decides the duplicate-key message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uniqueness {
    /// Duplicates allowed (a clustered one gets a hidden uniquifier).
    NonUnique,
    /// A PRIMARY KEY constraint.
    PrimaryKey,
    /// A UNIQUE constraint.
    UniqueConstraint,
    /// A unique index that is not a constraint.
    UniqueIndex,
}

impl Uniqueness {
    /// Whether duplicates are rejected.
    pub fn is_unique(self) -> bool {
        self != Uniqueness::NonUnique
    }
}

/// Per-index physical options.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct IndexOptions {
    /// The latch flavour of the index's pages.
    pub latch_policy: LatchPolicy,
    /// How inserts reach the leaf.
    pub insert_path: InsertPath,
    /// OPTIMIZE_FOR_SEQUENTIAL_KEY: flow control at the entrance of the index's insert path.
    pub optimize_for_sequential_key: bool,
}

/// One index: the clustered index (which holds the rows) or a nonclustered one (which holds
/// its key columns and the clustered key as the row locator).
#[derive(Clone, Debug)]
pub struct IndexDef {
    /// The name (the constraint name for PRIMARY KEY and UNIQUE).
    pub name: String,
    /// Key columns, by name, in key order (ascending).
    pub columns: Vec<String>,
    /// Uniqueness.
    pub uniqueness: Uniqueness,
    /// Physical options.
    pub options: IndexOptions,
}

impl IndexDef {
    /// An index on `columns`.
    pub fn new(name: impl Into<String>, columns: &[&str], uniqueness: Uniqueness) -> Self {
        IndexDef {
            name: name.into(),
            columns: columns.iter().map(|column| (*column).to_owned()).collect(),
            uniqueness,
            options: IndexOptions::default(),
        }
    }

    /// Sets the physical options.
    pub fn with_options(mut self, options: IndexOptions) -> Self {
        self.options = options;
        self
    }
}

/// A table: columns, the clustered index and the nonclustered indexes.
#[derive(Clone, Debug)]
pub struct TableDef {
    /// The name, unique in the database (case-insensitive).
    pub name: String,
    /// Columns in order.
    pub columns: Vec<ColumnDef>,
    /// The clustered index. Without one the rows are keyed by a hidden 8-byte uniquifier
    /// alone (handed out in per-thread blocks, so not in insertion order), which is how
    /// lastpage stores a heap.
    pub clustered: Option<IndexDef>,
    /// Nonclustered indexes.
    pub nonclustered: Vec<IndexDef>,
    /// Hash partitioning, if any.
    pub partition: Option<PartitionDef>,
    /// Whether changes are logged (the default). A table that is not logged costs no log
    /// writes, and recovery after a crash empties it, as PostgreSQL does with UNLOGGED tables;
    /// after a clean shutdown it keeps its rows.
    pub logged: bool,
}

/// Hash partitioning: rows go to partition `value % partitions` of an integer column, and every
/// index is split the same way (N separate B-trees per index). The seeds build this with a
/// persisted `InsertID % 16` column and a partition function with one partition per value.
#[derive(Clone, Debug)]
pub struct PartitionDef {
    /// The partitioning column; it must be part of the clustered key.
    pub column: String,
    /// Number of partitions.
    pub partitions: u16,
}

impl TableDef {
    /// A table with no columns yet.
    pub fn new(name: impl Into<String>) -> Self {
        TableDef {
            name: name.into(),
            columns: Vec::new(),
            clustered: None,
            nonclustered: Vec::new(),
            partition: None,
            logged: true,
        }
    }

    /// Makes the table non-logged (see [`TableDef::logged`]).
    pub fn not_logged(mut self) -> Self {
        self.logged = false;
        self
    }

    /// Adds a column.
    pub fn column(mut self, column: ColumnDef) -> Self {
        self.columns.push(column);
        self
    }

    /// Sets the clustered index.
    pub fn clustered(mut self, index: IndexDef) -> Self {
        self.clustered = Some(index);
        self
    }

    /// Partitions the table on `column` into `partitions` partitions.
    pub fn partitioned(mut self, column: impl Into<String>, partitions: u16) -> Self {
        self.partition = Some(PartitionDef {
            column: column.into(),
            partitions,
        });
        self
    }

    /// Adds a nonclustered index.
    pub fn nonclustered(mut self, index: IndexDef) -> Self {
        self.nonclustered.push(index);
        self
    }
}
