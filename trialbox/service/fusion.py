"""SandboxFusion-compatible `POST /run_code` (placeholder router; filled in below)."""
from fastapi import APIRouter

router = APIRouter(tags=["sandboxfusion"])
