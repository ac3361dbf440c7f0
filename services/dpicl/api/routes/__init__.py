"""Route modules; each is a thin APIRouter over the pipelines."""
