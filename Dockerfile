# The portal image: web (ASGI), worker and beat run from it with different commands.
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
RUN DEBUG=true python manage.py collectstatic --no-input
RUN useradd --system --uid 10001 portal
USER portal
EXPOSE 8000
CMD ["uvicorn", "portal.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--lifespan", "off"]
