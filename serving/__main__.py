from serving.cli import app

app()
