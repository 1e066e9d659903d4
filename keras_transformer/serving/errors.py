"""The server's errors as LibreTranslate answers them: a status and a
JSON body `{"error": "message"}`, never a traceback.

`ApiError` is raised by the routes; the handlers installed here answer it,
FastAPI's own validation errors (422), Starlette's HTTP errors (404, 405)
and anything unexpected (500, logged with its traceback on the server).
"""

import logging

logger = logging.getLogger("keras_transformer.serving")


class ApiError(Exception):
    """An error answered as `{"error": message}` with an HTTP `status`."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def error_response(status, message):
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status)


def install_error_handlers(app):
    """Answers every error of `app` as `{"error": ...}`."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(ApiError)
    async def api_error(request, error):
        return error_response(error.status, error.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, error):
        problems = []
        for problem in error.errors():
            where = ".".join(str(part) for part in problem.get("loc", ()) if part != "body")
            problems.append(f"{where}: {problem.get('msg')}" if where else str(problem.get("msg")))
        return error_response(422, "Invalid request: " + "; ".join(problems))

    @app.exception_handler(HTTPException)
    async def http_error(request, error):
        return error_response(error.status_code, str(error.detail))

    @app.exception_handler(Exception)
    async def unexpected_error(request, error):
        return internal_error(request.method, request.url.path, error)


def internal_error(method, path, error):
    """The answer to an unexpected `error`: logged here with its
    traceback, a 500 naming it for the client."""
    logger.error("%s %s failed", method, path, exc_info=error)
    return error_response(500, f"Internal error: {type(error).__name__}: {error}")
