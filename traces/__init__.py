from traces.request import Request

__all__ = ["Request"]
