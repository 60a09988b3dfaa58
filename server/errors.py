"""The one error every route answers with: OpenAI's error shape and an HTTP status. Raised
anywhere in a request (a view, a before_request hook, a helper), it is turned into the
response by the handler `init_app` registers, so no view repeats try/reply."""


class ApiError(Exception):
    """An error answered in OpenAI's shape with an HTTP status (and, when the client may try
    again later, after how many seconds). Every route's errors use it, the classroom's too."""

    def __init__(self, status, message, param=None, code=None, retry_after=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after = retry_after

    def body(self):
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def reply(self):
        """(body, status, headers): what a Flask view or before_request hook returns."""
        headers = {"Retry-After": str(max(1, round(self.retry_after)))} if self.retry_after else {}
        return self.body(), self.status, headers


def init_app(app):
    app.register_error_handler(ApiError, lambda e: e.reply())
