// Typed errors: one class per family of the API's machine-readable codes.

/** An error answered by the API: `code` is the API's machine-readable code. */
export class PandaStackError extends Error {
  readonly code: string;
  readonly status: number;
  constructor(message: string, code = "error", status = 0) {
    super(`${code}: ${message}`);
    this.name = "PandaStackError";
    this.code = code;
    this.status = status;
  }
}
export class InvalidArgumentError extends PandaStackError {}
export class InvalidCwdError extends InvalidArgumentError {}
export class ExceedsTemplateError extends InvalidArgumentError {}
export class CommandNotFoundError extends InvalidArgumentError {}
export class UnauthorizedError extends PandaStackError {}
export class ForbiddenError extends PandaStackError {}
export class PermissionDeniedError extends ForbiddenError {}
export class NotFoundError extends PandaStackError {}
export class SandboxNotFoundError extends NotFoundError {}
export class FileNotFoundError extends NotFoundError {}
export class TemplateNotFoundError extends NotFoundError {}
export class SnapshotNotFoundError extends NotFoundError {}
export class VolumeNotFoundError extends NotFoundError {}
export class ConflictError extends PandaStackError {}
export class SandboxHibernatedError extends ConflictError {}
export class SandboxStoppedError extends ConflictError {}
export class SandboxFailedError extends SandboxStoppedError {}
export class SandboxBusyError extends ConflictError {}
export class VolumeInUseError extends ConflictError {}
export class VolumeAttachedError extends ConflictError {}
export class TemplateInUseError extends ConflictError {}
/** A template build that ended in failure: `logTail` has the end of its log. */
export class TemplateBuildFailedError extends PandaStackError {
  readonly logTail: string;
  constructor(message: string, logTail: string) { super(message, "template_build_failed", 0); this.logTail = logTail; }
}
export class DatabaseNotFoundError extends NotFoundError {}
export class DatabaseHibernatedError extends ConflictError {}
export class DatabaseFailedError extends ConflictError {}
export class ManagedByDatabaseError extends ConflictError {}
export class BackupNotFoundError extends NotFoundError {}
export class IsADirectoryError extends ConflictError {}
export class NotADirectoryError extends ConflictError {}
export class FileExistsError extends ConflictError {}
export class DirectoryNotEmptyError extends ConflictError {}
export class PayloadTooLargeError extends PandaStackError {}
export class RateLimitedError extends PandaStackError {}
export class NoSpaceError extends PandaStackError {}
export class GuestIOError extends PandaStackError {}
export class TransitionFailedError extends PandaStackError {}
export class StartFailedError extends PandaStackError {}
export class ExecFailedError extends PandaStackError {}
export class NotImplementedError extends PandaStackError {}
export class TimeoutError extends PandaStackError {}
export class ConnectionError extends PandaStackError {}
export class QuotaExceededError extends PandaStackError {}
export class HostFullError extends PandaStackError {}
